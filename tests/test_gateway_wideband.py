"""G.722 and RFC 4733 through the whole service: sipp (the PBX) streams a bundled recording in
G.722 and in PCMU to the demo model, then keys in digits; redis-server receives the events.

The G.722 call's finals must read like the PCMU call's (demo CER bound); the keys arrive as
``dtmf`` events, masked on a route with ``redaction: mask`` and shown where it is ``keep``,
and as counts in ``call.ended.stats``; no key press is decoded as audio.
"""

from __future__ import annotations

from pathlib import Path

from asr_common.scoring import cer
from asr_core.audio_io import read_wav
from asr_gateway.dev.sipp_calls import G722, PCMU, place_call
from asr_gateway.service import Ports, Service
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
  default: {kb_set: hotline, dtmf: publish, redaction: mask}
  open-keys: {kb_set: hotline, dtmf: publish, redaction: keep}
  count-only: {kb_set: hotline, dtmf: count}
routes:
  - {name: keys-shown, match: {to_user: '^keys$'}, profile: open-keys}
  - {name: keys-counted, match: {to_user: '^count$'}, profile: count-only}
"""


def test_g722_call_reads_like_pcmu_and_keys_are_published(tmp_path: Path, redis_server: RedisServer) -> None:
    config = service_config(tmp_path, redis_server.url, ROUTES)
    seed = read_wav(DATA / "hotline_seed.wav")

    async def check_totals(service: Service, ports: Ports) -> None:
        totals = service.rtp_totals.snapshot()
        assert totals["dtmf_events"] == 7 and totals["unknown_payload_packets"] == 0

    run_calls(
        config,
        lambda port: [
            place_call(tmp_path / "u", port, seed.samples, 16000, payload_type=PCMU, call_tag="pcmu",
                       to_user="count", keys="12"),
            place_call(tmp_path / "w", port, seed.samples, 16000, payload_type=G722, call_tag="g722", keys="4#"),
            place_call(tmp_path / "k", port, seed.samples[:16000], 16000, payload_type=G722, call_tag="keys",
                       to_user="keys", keys="90*"),
        ],
        after=check_totals,
    )  # fmt: skip
    events = read_valid_events(redis_server.url)
    by_call: dict[str, list[dict[str, object]]] = {}
    for event in events:
        by_call.setdefault(str(event["sip_call_id"]).split("-")[0], []).append(event)
    finals = {tag: "".join(str(e["text"]) for e in evs if e["event_type"] == "transcript.final")
              for tag, evs in by_call.items()}  # fmt: skip
    assert finals["pcmu"] and finals["g722"], finals
    assert cer(finals["g722"], finals["pcmu"]) <= GOOD_ENOUGH_CER, finals

    def keys(tag: str) -> list[tuple[object, object, object]]:
        return [(e["digit"], e["redacted"], e["index"]) for e in by_call[tag] if e["event_type"] == "dtmf"]

    assert keys("g722") == [(None, True, 0), (None, True, 1)]  # default route: redaction mask
    assert keys("keys") == [("9", False, 0), ("0", False, 1), ("*", False, 2)]
    assert keys("pcmu") == []  # dtmf: count publishes no event
    ended = {tag: next(e for e in evs if e["event_type"] == "call.ended") for tag, evs in by_call.items()}
    assert list(ended["pcmu"]["stats"]["dtmf_events"].values()) == [2]  # type: ignore[index]
    assert list(ended["keys"]["stats"]["dtmf_events"].values()) == [3]  # type: ignore[index]
    assert all(e["duration_ms"] == 100 for e in events if e["event_type"] == "dtmf")
