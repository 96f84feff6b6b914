"""``asr-bench archive``: the call archive's write rate and search latency, SQLite and PostgreSQL;
prints one JSON object.

``--calls`` generated calls (default 100,000), each as the firehose carries it: ``call.started``
(an agent of ``--agents``), a caller's and an agent's final (a demand phrase of ten, an address
on one of twenty streets, filler), a ``tags`` event (the demand, the address), a KB card and
``call.ended``: six events, written in batches of ``--batch`` events per transaction, as
``asr-archive run`` writes them (``archived_calls_per_s``: calls over the wall time of every
batch). Then each search of ``SEARCHES`` is run ``--repeats`` times, the first page of 50
newest-first and the next page after it (keyset): p50 and p95 in ms per kind. PostgreSQL is a
throwaway server (``archive.local_postgres``) unless ``--postgres URL`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from archive.local_postgres import LocalPostgres
from archive.sql import SqlStore
from archive.store import CallQuery, open_store
from kb_hooks.events import utc_timestamp_ms

DEMANDS = [
    ("市政设施/井盖", "井盖破损"),
    ("市政设施/路灯", "路灯不亮"),
    ("环境/噪音", "噪音扰民"),
    ("交通/信号灯", "红绿灯坏了"),
    ("供水/停水", "家里停水"),
    ("供暖/不热", "暖气不热"),
    ("环境/垃圾", "垃圾没人清"),
    ("市政设施/道路", "路面塌陷"),
    ("绿化/树木", "树枝折断"),
    ("物业/电梯", "电梯困人"),
]
STREETS = [
    "新华路",
    "人民路",
    "解放路",
    "中山路",
    "建设路",
    "和平路",
    "胜利路",
    "朝阳路",
    "光明路",
    "长江路",
    "黄河路",
    "复兴路",
    "友谊路",
    "文化路",
    "青年路",
    "东风路",
    "红旗路",
    "团结路",
    "幸福路",
    "健康路",
]
START_MS = 1_796_000_000_000  # the first generated call; one every 250 ms after it
FILLER = "您好请问有什么可以帮您我想反映一个问题麻烦尽快处理谢谢"
SEARCHES: dict[str, CallQuery] = {
    "phrase": CallQuery(phrase="路灯不亮"),
    "phrase_rare": CallQuery(phrase="幸福路37号"),
    "tag": CallQuery(tag="市政设施/井盖"),
    "tag_top_level": CallQuery(tag="环境"),
    "address": CallQuery(address="健康路"),
    "agent": CallQuery(agent="agent-17"),
    "phrase_and_agent": CallQuery(phrase="噪音扰民", agent="agent-3"),
    "time_range": CallQuery(started_from=utc_timestamp_ms(START_MS), started_to=utc_timestamp_ms(START_MS + 3_600_000)),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-bench archive", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--batch", type=int, default=500, help="events per transaction (asr-archive's default)")
    parser.add_argument("--repeats", type=int, default=40, help="runs of each search")
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--postgres", metavar="URL", help="an existing empty database instead of a throwaway server")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def generated_events(calls: int, agents: int, seed: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for n in range(calls):
        call_id = f"bench-{n:07d}"
        at = START_MS + n * 250
        label, phrase = DEMANDS[rng.randrange(len(DEMANDS))]
        address = f"{STREETS[rng.randrange(len(STREETS))]}{rng.randrange(1, 200)}号"
        filler = FILLER[rng.randrange(10) :][: rng.randrange(8, 20)]
        head = {
            "schema_version": "1",
            "call_id": call_id,
            "route": "hotline",
            "sip_call_id": call_id,
            "source_call_id": call_id,
        }
        caller = {"role": "caller", "aor": "sip:citizen@pbx", "label": None, "name": None}
        agent = f"agent-{rng.randrange(agents)}"

        def event(kind: str, ms: int, head: dict[str, Any] = head, at: int = at, **fields: Any) -> dict[str, Any]:
            return {**head, "event_type": kind, "event_id": uuid.uuid4().hex, "ts": utc_timestamp_ms(at + ms), **fields}

        yield event("call.started", 0, participant=None, participants=[caller], metadata={"X-Agent-Id": agent})
        yield event(
            "transcript.final",
            4000,
            participant=caller,
            utterance_id=0,
            is_partial=False,
            text=f"{filler}{address}{phrase}",
            begin_offset_ms=500,
            end_offset_ms=4000,
        )
        yield event(
            "transcript.final",
            8000,
            participant={**caller, "role": "agent"},
            utterance_id=0,
            is_partial=False,
            text=f"好的{address}{phrase}我们马上派人处理",
            begin_offset_ms=4500,
            end_offset_ms=8000,
        )
        yield event(
            "tags",
            4001,
            participant=caller,
            utterance_id=0,
            is_partial=False,
            tags=[
                {"kind": "demand", "label": label, "value": phrase, "normalized": None},
                {"kind": "entity", "label": "address", "value": address, "normalized": address},
            ],
        )
        yield event(
            "kb.suggestion",
            4002,
            participant=caller,
            utterance_id=0,
            is_partial=False,
            entry_id=f"kb-{label}",
            title=f"{label}处置流程",
            status="confirmed",
            score=1.0,
        )
        yield event("call.ended", 60_000, participant=None, reason="bye", stats={"duration_ms": 60_000})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(store: SqlStore, args: argparse.Namespace) -> dict[str, Any]:
    batch: list[dict[str, Any]] = []
    spent = 0.0
    for event in generated_events(args.calls, args.agents, args.seed):
        batch.append(event)
        if len(batch) == args.batch:
            began = time.perf_counter()
            store.apply(batch)
            spent += time.perf_counter() - began
            batch = []
    if batch:
        began = time.perf_counter()
        store.apply(batch)
        spent += time.perf_counter() - began
    assert store.count("calls") == args.calls, "every generated call archived"
    searches: dict[str, Any] = {}
    for name, query in SEARCHES.items():
        first, following, found = [], [], 0
        for _ in range(args.repeats):
            began = time.perf_counter()
            page = store.search(query)
            first.append((time.perf_counter() - began) * 1000)
            found = len(page.hits)
            if page.next_after is not None:
                began = time.perf_counter()
                store.search(CallQuery(**{**_fields(query), "after": page.next_after}))
                following.append((time.perf_counter() - began) * 1000)
        searches[name] = {
            "hits_first_page": found,
            "p50_ms": round(percentile(first, 0.5), 2),
            "p95_ms": round(percentile(first, 0.95), 2),
            "next_page_p95_ms": round(percentile(following, 0.95), 2) if following else None,
        }
    every = [v["p95_ms"] for v in searches.values()]
    return {
        "calls": args.calls,
        "events": args.calls * 6,
        "archived_calls_per_s": round(args.calls / spent, 1),
        "archived_events_per_s": round(args.calls * 6 / spent, 1),
        "search_p95_ms_worst": max(every),
        "searches": searches,
    }


def _fields(query: CallQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in CallQuery.__dataclass_fields__}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "archive",
        "calls": args.calls,
        "batch": args.batch,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
    }
    for kind in args.stores.split(","):
        if kind == "sqlite":
            with tempfile.TemporaryDirectory(prefix="archive-bench-") as workdir:
                store = open_store(f"sqlite://{Path(workdir) / 'archive.db'}")
                assert isinstance(store, SqlStore)
                try:
                    result["sqlite"] = measure(store, args)
                    result["sqlite"]["db_bytes"] = sum(p.stat().st_size for p in Path(workdir).iterdir())
                finally:
                    store.close()
        elif kind == "postgresql":
            server = None if args.postgres else LocalPostgres()
            try:
                if server is not None:
                    server.start()
                store = open_store(args.postgres or (server.url if server else ""))
                assert isinstance(store, SqlStore)
                try:
                    result["postgresql"] = measure(store, args)
                finally:
                    store.close()
            finally:
                if server is not None:
                    server.stop()
        else:
            raise SystemExit(f"asr-bench archive: unknown store {kind!r} (sqlite, postgresql)")
    print(json.dumps(result, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
