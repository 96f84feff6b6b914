"""L16 through the whole service: sipp (the PBX) offers L16/16000 and L16/8000 on dynamic
payload types and streams the bundled seed recording in it to the demo model, then keys in a
digit as RFC 4733 events at the audio's clock; redis-server receives the events. Each call's
finals must read the reference text within the demo CER bound, each key press must last its
100 ms, and no packet may count as an unknown payload type."""

from __future__ import annotations

from pathlib import Path

from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_gateway.dev.sipp_calls import place_call
from asr_gateway.service import Ports, Service
from rtp.codecs import codec
from tests.demo_quality import GOOD_ENOUGH_CER
from tests.redis_server import RedisServer, redis_server
from tests.service_calls import DATA, read_valid_events, run_calls, service_config
from tests.tool_marks import needs_redis_server, needs_sipp

__all__ = ["redis_server"]  # the fixture, used by name

pytestmark = [
    needs_sipp,
    needs_redis_server,
]


ROUTES = """
profiles:
  default: {kb_set: hotline, dtmf: publish, redaction: keep}
routes: []
"""


def test_l16_calls_are_transcribed(tmp_path: Path, redis_server: RedisServer) -> None:
    texts = dict(line.split(maxsplit=1) for line in (DATA / "text").read_text(encoding="utf-8").splitlines())
    config = service_config(tmp_path, redis_server.url, ROUTES)
    seed = read_wav(DATA / "hotline_seed.wav")
    wide, narrow = codec("L16/16000"), codec("L16/8000")
    assert wide.dynamic and narrow.dynamic

    async def check_totals(service: Service, ports: Ports) -> None:
        totals = service.rtp_totals.snapshot()
        assert totals["unknown_payload_packets"] == 0 and totals["bad_packets"] == 0, totals
        assert totals["dtmf_events"] == 2, totals

    run_calls(
        config,
        lambda port: [
            place_call(
                tmp_path / tag, port, seed.samples, 16000, payload_type=sent.payload_type, call_tag=tag, keys=key
            )
            for tag, sent, key in (("wide", wide, "7"), ("narrow", narrow, "8"))
        ],
        after=check_totals,
    )
    events = read_valid_events(redis_server.url)
    by_call: dict[str, list[dict[str, object]]] = {}
    for event in events:
        by_call.setdefault(str(event["sip_call_id"]).split("-")[0], []).append(event)
    finals = {tag: "".join(str(e["text"]) for e in evs if e["event_type"] == "transcript.final")
              for tag, evs in by_call.items()}  # fmt: skip
    assert set(finals) == {"wide", "narrow"}, finals
    for tag, text in finals.items():
        assert cer(text, texts["hotline_seed"]) <= GOOD_ENOUGH_CER, (tag, finals)
    keys = {
        tag: [(e["digit"], e["duration_ms"]) for e in evs if e["event_type"] == "dtmf"] for tag, evs in by_call.items()
    }
    assert keys == {"wide": [("7", 100)], "narrow": [("8", 100)]}, keys
