"""A real Asterisk 22 (tests/asterisk_peer.py) calls the service's SIP door from its PJSIP endpoint,
through the whole service to a local Redis: PCMU and PCMA calls in which Asterisk keys digits
(Dial's ``D`` option: RFC 4733 events, counted), a call Asterisk hangs up in mid-sentence (the
final still comes), and an offer of a codec the service does not take (a 488 whose Warning
Asterisk logs).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from asr_common.scoring import cer
from asr_gateway.service import Service
from sip.sdp import TAKEN_CODECS
from tests.asterisk_peer import AsteriskPeer, asterisk_build, service_on_port
from tests.audio_clients import DATA
from tests.demo_quality import GOOD_ENOUGH_CER, SEED_TEXT
from tests.redis_server import RedisServer
from tests.service_calls import free_port, read_valid_events, service_config, wait_drained
from tests.tool_marks import needs_redis_server
from tests.waiting import wait_until_async

# func_only: the first module to run builds Asterisk in its fixture (minutes), which no test's limit should count
pytestmark = [needs_redis_server, pytest.mark.timeout(300, func_only=True)]

ROUTES = "profiles:\n  default: {role: mixed, redaction: keep, dtmf: count}\nroutes: []\n"
CUT_AFTER_S = 2.5  # into the 5.4 s sentence (hotline_seed.wav)
CALL_TIMEOUT_S = 90.0  # a loaded 2-core runner: Asterisk's call, the decoding of its last seconds
EXTRA_PJSIP = """
; the same endpoint as svc, each offering one codec: PCMA, and GSM (which the service does not take)
[svc-alaw]
type = endpoint
transport = transport-udp
context = test
disallow = all
allow = alaw
dtmf_mode = rfc4733
from_user = pbx
aors = svc

; svc-cut: PCMU like svc, under a name of its own (the channel the test hangs up is PJSIP/svc-cut-...)
[svc-cut]
type = endpoint
transport = transport-udp
context = test
disallow = all
allow = ulaw
aors = svc

[svc-gsm]
type = endpoint
transport = transport-udp
context = test
disallow = all
allow = gsm
aors = svc
"""
EXTRA_DIALPLAN = """
[test](+)
; keys-<endpoint>: Dial the service, key 1 and 2 as RFC 4733 events (the endpoint's dtmf_mode) once
; it answers (Dial's D option: this build has no app_senddtmf); the Local channel's other half plays.
exten => _keys-.,1,Dial(PJSIP/asr@${EXTEN:5},20,D(12))
 same => n,Hangup()
"""


@pytest.fixture(scope="module")
def asterisk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsteriskPeer]:
    wav = DATA / "hotline_seed.wav"
    peer = AsteriskPeer(
        asterisk_build(),
        tmp_path_factory.mktemp("asterisk"),
        free_port(),
        wav,
        extra_dialplan=EXTRA_DIALPLAN,
        extra_pjsip=EXTRA_PJSIP,
    )
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()


@dataclass
class Run:
    """What one service run gave: the events in Redis, the service's log lines."""

    events: list[dict[str, Any]]
    service_log: list[str]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, asterisk: AsteriskPeer) -> Iterator[Run]:
    """One service run for every call of this module, placed together: PCMU and PCMA calls that key
    1 and 2; a PCMU call (to ``cut``) Asterisk hangs up ``CUT_AFTER_S`` into its sentence; an offer
    of GSM alone."""
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    redis.start()
    config = service_on_port(
        service_config(tmp_path_factory.mktemp("service"), redis.url, ROUTES), asterisk.svc_sip_port
    )
    log = _Lines()

    def events() -> list[dict[str, Any]]:
        return read_valid_events(redis.url)

    def cut_playing() -> bool:
        return re.search(r"<PJSIP/svc-cut-\w+> Playing '", asterisk.log_text()) is not None

    async def scenario() -> None:
        service = Service(config)
        await service.start()
        try:
            for command in (
                "channel originate Local/keys-svc@test extension play@test",
                "channel originate Local/keys-svc-alaw@test extension play@test",
                "channel originate PJSIP/cut@svc-cut extension play@test",
                "channel originate PJSIP/asr@svc-gsm extension play@test",
            ):
                await asyncio.to_thread(asterisk.rx, command)
            await wait_until_async(cut_playing, CALL_TIMEOUT_S, "Asterisk playing the sentence to cut")
            channel = await asyncio.to_thread(asterisk.channel_up, "PJSIP/svc-cut-")
            await asyncio.sleep(CUT_AFTER_S)  # paces Asterisk's sentence: the hangup comes in its middle
            await asyncio.to_thread(asterisk.rx, f"channel request hangup {channel}")
            await wait_until_async(lambda: len(ended(events())) == 3, CALL_TIMEOUT_S, "three calls ended")
            await wait_drained(service)
        finally:
            await service.stop(grace_s=5)

    root = logging.getLogger()
    level = root.level
    root.addHandler(log)
    root.setLevel(logging.INFO)  # as `asr-gateway serve` logs
    try:
        asyncio.run(scenario())
        yield Run(events(), log.lines)
    finally:
        root.removeHandler(log)
        root.setLevel(level)
        redis.stop()


def ended(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == "call.ended"]


def finals(events: list[dict[str, Any]], call_id: str) -> str:
    return "".join(e["text"] for e in events if e["event_type"] == "transcript.final" and e["call_id"] == call_id)


def dialled(events: list[dict[str, Any]], number: str) -> list[str]:
    """The ids of the calls to ``number``."""
    return [
        e["call_id"] for e in events if e["event_type"] == "call.started" and e["metadata"]["dialled_number"] == number
    ]


def test_pcmu_and_pcma_calls_with_keys_pressed(run: Run, asterisk: AsteriskPeer) -> None:
    calls = dialled(run.events, "asr")
    assert len(calls) == 2, calls  # the GSM offer to asr@ made no call
    for call in ended(run.events):
        if call["call_id"] not in calls:
            continue
        text = finals(run.events, call["call_id"])
        assert cer(text, SEED_TEXT) <= GOOD_ENOUGH_CER, (text, asterisk.log_tail())
        assert call["reason"] == "bye"
        assert list(call["stats"]["dtmf_events"].values()) == [2], call["stats"]
    answers = re.findall(r"SIP/2\.0 200 OK.*?m=audio \d+ RTP/AVP (\d+)", asterisk.log_text(), re.S)
    assert sorted(set(answers)) == ["0", "8"], answers  # the service answered PCMU, and PCMA to svc-alaw


def test_a_hangup_in_mid_sentence_still_gives_the_final(run: Run) -> None:
    (call,) = dialled(run.events, "cut")
    (end,) = [e for e in ended(run.events) if e["call_id"] == call]
    text = finals(run.events, call)
    assert end["reason"] == "bye"
    assert 3 <= len(text) <= len(SEED_TEXT) - 3, text  # what was said before the hangup, not all
    assert cer(text, SEED_TEXT[: len(text)]) <= GOOD_ENOUGH_CER, text


def test_an_offer_of_only_gsm_is_refused_488_and_both_sides_log_it(run: Run, asterisk: AsteriskPeer) -> None:
    log = asterisk.log_text()
    gsm_offer = log.index("a=rtpmap:3 GSM/8000")
    response = log[log.index("SIP/2.0 488", gsm_offer) :].split("\n\n", 1)[0]  # the SIP trace (pjsip set logger on)
    assert f'Warning: 304 hotline-asr "no {TAKEN_CODECS} audio stream to record"' in response.splitlines(), response
    assert log.count("SIP/2.0 488") == 1
    refused = [line for line in run.service_log if "refused 488" in line]
    assert len(refused) == 1 and f"no {TAKEN_CODECS} audio stream to record" in refused[0], run.service_log
