"""deploy/pbx/asterisk.md run as written, in a real Asterisk 22 (tests/asterisk_peer.py), through the
whole service to a local Redis.

The page's fenced blocks are read from the page itself: its ``pjsip.conf`` block and its dialplan
blocks are loaded into the private Asterisk, its YAML into the service's config and routes, and each
AMI ``Originate`` is sent as the equivalent ``channel originate`` CLI command (this Asterisk loads no
AMI). What a block names for a site is replaced by this test's: the service's address
(``10.0.0.20``), a fresh UUID for ``${UUID}``, and the example channel names of the two-stream recipe
(``PJSIP/trunk-00000042``) by the channels Asterisk made; and G.722 left out of the endpoint's
``allow`` (``without_g722``); nothing else is changed.

The spied channels are real PJSIP channels named as on the page (``PJSIP/1001-...``,
``PJSIP/trunk-...``): Asterisk calls itself through endpoints ``1001`` and ``trunk``, and the called
side plays a bundled sentence after a pause long enough for the spy to be in place.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asr_common.scoring import cer
from asr_gateway.service import Service
from tests.asterisk_peer import AsteriskPeer, asterisk_build, service_on_port
from tests.audio_clients import DATA
from tests.demo_quality import GOOD_ENOUGH_CER, SEED_TEXT
from tests.redis_server import RedisServer
from tests.service_calls import REPO, free_port, read_valid_events, service_config, wait_drained
from tests.tool_marks import needs_redis_server
from tests.waiting import wait_until_async

pytestmark = [
    needs_redis_server,
    pytest.mark.timeout(300, func_only=True),
]  # the first module builds Asterisk in its fixture

DOC = REPO / "deploy" / "pbx" / "asterisk.md"
DOC_HOST = "10.0.0.20"
CALL_TIMEOUT_S = 90.0  # a loaded 2-core runner: Asterisk's calls, the decoding of their last seconds
AGENT_TEXT = "早上七点多北京路附近暖气不热"  # tests/data/hotline_8k/text, hotline_1
# Asterisk calls itself as PJSIP/1001 (the agent, saying hotline_1) and PJSIP/trunk (the caller,
# saying the seed sentence); its own calls come in from 127.0.0.1, identified as template endpoint
# svc, whose context is [test].
SPIED_PJSIP = """
[1001]
type = aor
contact = sip:agent-says@127.0.0.1:@AST_SIP_PORT@

[1001]
type = endpoint
transport = transport-udp
context = test
disallow = all
allow = ulaw
aors = 1001

[trunk]
type = aor
contact = sip:caller-says@127.0.0.1:@AST_SIP_PORT@

[trunk]
type = endpoint
transport = transport-udp
context = test
disallow = all
allow = ulaw
aors = trunk
"""
SPIED_DIALPLAN = """
[test](+)
exten => agent-says,1,Answer()
 same => n,Wait(3)
 same => n,Playback(@AGENT_WAV@)
 same => n,Wait(1)
 same => n,Hangup()
exten => caller-says,1,Answer()
 same => n,Wait(3)
 same => n,Playback(@WAV@)
 same => n,Wait(1)
 same => n,Hangup()
"""


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Each fenced code block of a Markdown page: (its language tag, its text)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def doc_blocks() -> dict[str, list[str]]:
    """The page's blocks by kind: ``pjsip``, ``dialplan``, ``ami``, ``routes``, ``door``."""
    kinds: dict[str, list[str]] = {"pjsip": [], "dialplan": [], "ami": [], "routes": [], "door": []}
    for lang, block in fenced_blocks(DOC.read_text(encoding="utf-8")):
        if lang == "ini" and "type = endpoint" in block:
            kinds["pjsip"].append(block)
        elif "exten =>" in block:
            kinds["dialplan"].append(block)
        elif block.startswith("Action: "):
            kinds["ami"].extend(action for action in block.strip().split("\n\n"))
        elif lang == "yaml" and "routes:" in block:
            kinds["routes"].append(block)
        elif lang == "yaml" and block.startswith("audiosocket:"):
            kinds["door"].append(block)
        else:
            raise AssertionError(f"a block of {DOC.name} this test does not know how to run:\n{block}")
    return kinds


BLOCKS = doc_blocks()


def originate_command(action: str, replacements: dict[str, str]) -> str:
    """An AMI ``Originate`` of the page as a ``channel originate`` CLI command (its application, or
    its context and extension)."""
    for old, new in replacements.items():
        action = action.replace(old, new)
    fields = dict(line.split(": ", 1) for line in action.splitlines() if ": " in line)
    assert fields.pop("Action") == "Originate", action
    if "Application" in fields:
        return f"channel originate {fields['Channel']} application {fields['Application']} {fields.get('Data', '')}"
    assert fields.get("Priority", "1") == "1", action
    return f"channel originate {fields['Channel']} extension {fields['Exten']}@{fields['Context']}"


def without_g722(pjsip: str) -> str:
    """The page's endpoint less G.722: the shared build has no codec_g722, and an Asterisk without it
    still offers G.722, which the service takes and Asterisk then drops ("Unable to find a codec
    translation path"), as the page warns. The one change made to a block beyond addresses."""
    assert "allow = g722,ulaw,alaw" in pjsip, pjsip
    return pjsip.replace("allow = g722,ulaw,alaw", "allow = ulaw,alaw")


@pytest.fixture(scope="module")
def asterisk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsteriskPeer]:
    svc_port = free_port()
    (pjsip,) = BLOCKS["pjsip"]
    dialplan = SPIED_DIALPLAN.replace("@AGENT_WAV@", str((DATA / "hotline_1.wav").with_suffix("")))
    peer = AsteriskPeer(
        asterisk_build(),
        tmp_path_factory.mktemp("asterisk"),
        svc_port,
        DATA / "hotline_seed.wav",
        extra_dialplan="\n".join([*BLOCKS["dialplan"], dialplan]),
        extra_pjsip="\n".join([without_g722(pjsip).replace(f"{DOC_HOST}:5060", f"127.0.0.1:{svc_port}"), SPIED_PJSIP]),
    )
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()


def doc_config(tmp_path: Path, redis_url: str, svc_port: int) -> Any:
    """The page's door line (on loopback, a free port) and its routes, with a default profile for
    the streams they do not match (the mixed stream, the spy call): X-Agent-Id into the metadata."""
    (routes_block,) = BLOCKS["routes"]
    routes = yaml.safe_load(routes_block)
    routes["profiles"]["default"] = {"role": "mixed", "redaction": "keep", "metadata_headers": ["X-Agent-Id"]}
    (door_block,) = BLOCKS["door"]
    door = yaml.safe_load(door_block)
    door["audiosocket"].update(host="127.0.0.1", port=0)
    config = service_config(tmp_path, redis_url, yaml.safe_dump(routes), yaml.safe_dump(door))
    return service_on_port(config, svc_port)


MIXED_STREAM = str(uuid.uuid4())  # the page's ${UUID}


def recipe_commands(names: dict[str, str], address: str) -> list[str]:
    """Every Originate of the page, with this run's door address, UUID and spied channels."""
    replacements = {
        f"{DOC_HOST}:9092": address,
        "${UUID}": MIXED_STREAM,
        "PJSIP/trunk-00000042": names["trunk"],
        "PJSIP/1001-00000043": names["1001"],
    }
    return [originate_command(action, replacements) for action in BLOCKS["ami"]]


@pytest.fixture(scope="module")
def recipe_events(tmp_path_factory: pytest.TempPathFactory, asterisk: AsteriskPeer) -> Iterator[list[dict[str, Any]]]:
    """One service run for all the page's recipes at once (each spy is its own call): Asterisk calls
    itself as PJSIP/trunk and PJSIP/1001, every Originate of the page spies on them; the events once
    the three calls (the mixed stream, the joined pair, the SIP spy call) have ended."""
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    redis.start()
    config = doc_config(tmp_path_factory.mktemp("service"), redis.url, asterisk.svc_sip_port)

    def ended() -> int:
        return sum(e["event_type"] == "call.ended" for e in read_valid_events(redis.url))

    async def scenario() -> None:
        service = Service(config)
        await service.start()
        assert service.doors.audiosocket is not None
        address = f"127.0.0.1:{service.doors.audiosocket.port}"
        try:
            for endpoint in ("trunk", "1001"):
                await asyncio.to_thread(asterisk.rx, f"channel originate PJSIP/{endpoint} application Wait 30")
            names = {e: await asyncio.to_thread(asterisk.channel_up, f"PJSIP/{e}-") for e in ("trunk", "1001")}
            for command in recipe_commands(names, address):
                await asyncio.to_thread(asterisk.rx, command)
            await wait_until_async(lambda: ended() >= 3, CALL_TIMEOUT_S, "the three spy calls ended")
            await wait_drained(service)
        finally:
            await service.stop(grace_s=5)

    try:
        asyncio.run(scenario())
        yield read_valid_events(redis.url)
    finally:
        redis.stop()


def call_events(events: list[dict[str, Any]], **started: str) -> list[dict[str, Any]]:
    """The events of the one call whose call.started has the given fields."""
    (call,) = [
        e for e in events if e["event_type"] == "call.started" and all(e.get(key) == v for key, v in started.items())
    ]
    return [e for e in events if e["call_id"] == call["call_id"]]


def finals(events: list[dict[str, Any]], role: str) -> str:
    return "".join(
        e["text"] for e in events if e["event_type"] == "transcript.final" and e["participant"]["role"] == role
    )


def test_the_blocks_of_the_page_are_all_run() -> None:
    """Every block is one this module runs: a new one must be given a test here."""
    assert [len(BLOCKS[kind]) for kind in ("pjsip", "door", "routes")] == [1, 1, 1]
    assert BLOCKS["dialplan"] and len(BLOCKS["ami"]) == 4


def test_one_mixed_stream_per_call(recipe_events: list[dict[str, Any]], asterisk: AsteriskPeer) -> None:
    events = call_events(recipe_events, source_call_id=MIXED_STREAM)
    assert events[0]["source"] == "audiosocket"
    text = finals(events, "mixed")
    assert cer(text, AGENT_TEXT) <= GOOD_ENOUGH_CER, (text, asterisk.log_tail())


def test_caller_and_agent_as_one_call(recipe_events: list[dict[str, Any]], asterisk: AsteriskPeer) -> None:
    ids = {e.get("source_call_id", "") for e in recipe_events}
    (caller_stream,) = [stream for stream in ids if stream.endswith("-000000000001")]  # the page's caller UUID
    events = call_events(recipe_events, source_call_id=caller_stream)
    assert sorted(p["role"] for p in events[0]["participants"]) == ["agent", "caller"]
    assert cer(finals(events, "caller"), SEED_TEXT) <= GOOD_ENOUGH_CER, (events, asterisk.log_tail())
    assert cer(finals(events, "agent"), AGENT_TEXT) <= GOOD_ENOUGH_CER, (events, asterisk.log_tail())


def test_spy_call_over_sip_carries_the_agent(recipe_events: list[dict[str, Any]], asterisk: AsteriskPeer) -> None:
    events = call_events(recipe_events, source="sip")
    assert events[0]["metadata"].get("X-Agent-Id") == "1001", events[0]["metadata"]
    assert cer(finals(events, "mixed"), AGENT_TEXT) <= GOOD_ENOUGH_CER, (events, asterisk.log_tail())
