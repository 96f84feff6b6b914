"""SRTP through the whole service: sipp offers RTP/SAVP with an SDES key, a libsrtp sender
(``pylibsrtp``) streams the bundled recording protected with it, Redis gets the transcript.

The same recording sent as plain RTP in the same run must give the same final text; a sender
using another key than the one it offered gets its packets counted as authentication
failures and no transcript at all. Neither key may appear in the logs or in Redis.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import urllib.request
from pathlib import Path

import pytest

from asr_core.audio_io import read_wav
from asr_gateway.dev.sipp_calls import place_call
from asr_gateway.service import Ports, Service
from rtp.srtp import SrtpKeys
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, read_valid_events, run_calls, service_config
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]  # the fixture, imported for pytest

pytestmark = [
    needs_sipp,
    needs_redis_server,
]

KEY = bytes(range(7, 37))
WRONG_KEY = bytes(range(8, 38))


def test_srtp_call_reads_like_the_plain_call_and_a_wrong_key_reads_nothing(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = service_config(
        tmp_path, redis_server.url, "profiles:\n  default:\n    kb_set: hotline\n    srtp: optional\n"
    )
    seed = read_wav(DATA / "hotline_seed.wav")
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", KEY)
    totals: dict[str, int] = {}
    metrics: list[str] = []

    async def read_counters(service: Service, ports: Ports) -> None:
        totals.update(service.rtp_totals.snapshot())
        url = f"http://127.0.0.1:{ports.metrics}/metrics"
        metrics.append(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode()))

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "plain", port, seed.samples, 16000, call_tag="plain"),
            place_call(tmp_path / "srtp", port, seed.samples, 16000, call_tag="srtp", srtp=keys),
            place_call(tmp_path / "wrong", port, seed.samples, 16000, call_tag="wrong", srtp=keys,
                       srtp_send_key=WRONG_KEY),
        ],
        after=read_counters,
    )  # fmt: skip
    events = read_valid_events(redis_server.url)
    tag_of = {e["call_id"]: e["sip_call_id"].split("-")[0] for e in events if e["event_type"] == "call.started"}
    finals: dict[str, str] = {"plain": "", "srtp": "", "wrong": ""}
    transcripts: dict[str, int] = dict.fromkeys(finals, 0)
    for event in events:
        tag = tag_of[event["call_id"]]
        if event["event_type"].startswith("transcript."):
            transcripts[tag] += 1
        if event["event_type"] == "transcript.final":
            finals[tag] += event["text"]
    assert finals["plain"], "the plain call was transcribed"
    assert finals["srtp"] == finals["plain"]
    assert transcripts["wrong"] == 0 and set(tag_of.values()) == set(finals)
    packets = int(seed.samples.shape[0] / 16000 * 50)
    assert totals["srtp_auth_failed"] >= packets - 1, totals
    assert totals["srtp_replayed"] == totals["srtp_bad"] == 0
    exported = re.search(r'^asr_rtp_total\{counter="srtp_auth_failed"\} ([0-9.e+]+)$', metrics[0], re.MULTILINE)
    assert exported is not None and float(exported.group(1)) == totals["srtp_auth_failed"]
    for secret in (KEY, WRONG_KEY):
        for text in (base64.b64encode(secret).decode(), secret.hex(), repr(secret)[2:-1]):
            assert text not in caplog.text
            assert text not in str(events) and text not in metrics[0]
