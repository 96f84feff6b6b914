"""The archive store on SQLite and on a real PostgreSQL (started by the test): an event applied
twice changes nothing; a call is found by a phrase of its caller's words (Chinese, no word
segmentation), its tag or its category's top level, its address, its agent, its route and its
time; pages follow each other without gaps or repeats; retention deletes what is past its time
and nothing else; the schema is at the newest migration, and opening it again migrates nothing."""

from __future__ import annotations

from dataclasses import replace

from archive.migrations import LATEST
from archive.sql import SqlStore
from archive.store import CallQuery, open_store
from kb_hooks import events as ev
from kb_hooks.types import CallContext, Participant, RedactionMode
from tests.archive_db import postgres, store_url

__all__ = ["postgres", "store_url"]

CALLER = Participant("caller", "sip:citizen@pbx")
AGENT = Participant("agent", "sip:1001@pbx")


def a_call(call_id: str, agent: str, words: str, tag: str, ts: int, route: str = "hotline") -> list[ev.Event]:
    """A call's durable events as JSON dicts would carry them, at unix ms ``ts``."""
    ctx = CallContext(call_id, route=route, redaction=RedactionMode.MASK)
    stamp = ev.utc_timestamp_ms(ts)
    span = ev.Span(0, 2)
    return [
        ev.CallStarted(call=ctx, participants=(CALLER, AGENT), metadata={"X-Agent-Id": agent}, ts=stamp),
        ev.TranscriptFinal(call=ctx, participant=CALLER, utterance_id=0, text=words,
                           begin_offset_ms=0, end_offset_ms=3000, tokens=(), confidence=0.9, latency_ms=100,
                           nbest=(), ts=stamp),
        ev.Tags(call=ctx, participant=CALLER, utterance_id=0, is_partial=False, ts=stamp, tags=(
            ev.Tag(kind="demand", label=tag, value=words[:2], normalized=None, span=span, homophone=False,
                   redacted=False),
            ev.Tag(kind="entity", label="address", value="新华路12号", normalized="新华路12号", span=span,
                   homophone=False, redacted=False),
        )),
        ev.CallEnded(call=ctx, reason="bye", stats={"duration_ms": 3000}, ts=ev.utc_timestamp_ms(ts + 60_000)),
    ]  # fmt: skip


def as_json(events: list[ev.Event]) -> list[dict[str, object]]:
    return [e.to_json() for e in events]


DAY_MS = 86_400_000
T0 = 1_796_000_000_000  # 2026-11-30 00:53:20 UTC, unix ms


def test_idempotent_by_event_id_and_migrated(store_url: str) -> None:
    store = open_store(store_url)
    assert isinstance(store, SqlStore)
    try:
        events = as_json(a_call("c1", "1001", "我家门口的井盖坏了", "市政设施/井盖", T0))
        assert store.apply(events) == 4
        before = {t: store.count(t) for t in ("calls", "events", "finals", "tags")}
        assert store.apply(events) == 0 and store.apply(events[1:3]) == 0
        assert {t: store.count(t) for t in before} == before == {"calls": 1, "events": 4, "finals": 1, "tags": 2}
        assert store.schema_version() == LATEST
    finally:
        store.close()
    again = open_store(store_url)
    assert again.schema_version() == LATEST and again.call("c1") is not None
    again.close()


def test_search_by_every_criterion_and_keyset_pages(store_url: str) -> None:
    store = open_store(store_url)
    try:
        store.apply(as_json(a_call("manhole", "1001", "我家门口的井盖坏了有人掉下去", "市政设施/井盖", T0)))
        store.apply(as_json(a_call("lamp", "1002", "路灯一直不亮", "市政设施/路灯", T0 + 1000, route="night")))
        for n in range(25):
            store.apply(as_json(a_call(f"noise-{n:02d}", "1003", f"噪音扰民第{n}次", "环境/噪音", T0 + 10_000 + n)))

        def ids(**criteria: object) -> list[str]:
            return [hit.call_id for hit in store.search(CallQuery(**criteria)).hits]  # type: ignore[arg-type]

        assert ids(phrase="井盖坏了") == ["manhole"]  # a phrase inside the caller's words
        assert ids(phrase="井盖") == ["manhole"]  # two characters: under the trigram index, still found
        assert ids(phrase="坏了有人掉") == ["manhole"] and ids(phrase="井盖不亮") == []
        assert ids(tag="市政设施/路灯") == ["lamp"] and ids(tag="市政设施") == ["lamp", "manhole"]
        assert ids(agent="1001") == ["manhole"] and ids(route="night") == ["lamp"]
        assert ids(address="新华路", agent="1002") == ["lamp"]
        assert ids(started_from=ev.utc_timestamp_ms(T0 + 500), started_to=ev.utc_timestamp_ms(T0 + 10_000)) == ["lamp"]
        assert ids(phrase="100%_x") == []  # wildcards taken literally
        hit = store.search(CallQuery(phrase="井盖坏了")).hits[0]
        assert hit.first_words == "我家门口的井盖坏了有人掉下去" and hit.agent == "1001" and hit.end_reason == "bye"

        seen: list[str] = []
        after = None
        while True:
            page = store.search(CallQuery(tag="环境", limit=10, after=after))
            seen += [h.call_id for h in page.hits]
            if page.next_after is None:
                break
            after = page.next_after
        assert seen == [f"noise-{n:02d}" for n in reversed(range(25))]

        record = store.call("manhole")
        assert record is not None and record.agent == "1001" and record.end_reason == "bye"
        assert [f["text"] for f in record.finals] == ["我家门口的井盖坏了有人掉下去"]
        assert {t["label"] for t in record.tags} == {"市政设施/井盖", "address"}
        store.log_access("sup", "search", {"phrase": "井盖"})
        store.log_access("sup", "view", {"call_id": "manhole"})
        log = store.access_log()
        assert [(e.user, e.action, e.what) for e in log] == [
            ("sup", "view", {"call_id": "manhole"}), ("sup", "search", {"phrase": "井盖"})]  # fmt: skip
    finally:
        store.close()


def test_retention_deletes_only_what_is_past_its_time(store_url: str) -> None:
    from datetime import UTC, datetime

    from archive.archiver import Retention

    store = open_store(store_url)
    assert isinstance(store, SqlStore)
    try:
        now = T0 + 100 * DAY_MS
        store.apply(as_json(a_call("old-hotline", "1", "井盖坏了很久", "市政设施/井盖", now - 40 * DAY_MS)))
        store.apply(as_json(a_call("new-hotline", "1", "井盖又坏了", "市政设施/井盖", now - 10 * DAY_MS)))
        store.apply(as_json(a_call("old-night", "1", "路灯不亮了", "市政设施/路灯", now - 40 * DAY_MS, route="night")))
        store.apply(as_json(a_call("ancient-other", "1", "噪音扰民", "环境/噪音", now - 400 * DAY_MS, route="x")))
        retention = Retention({"hotline": 30, "night": 90}, default_days=365)
        assert retention.sweep(store, datetime.fromtimestamp(now / 1000, UTC)) == 2
        assert list(store.call_ids()) == ["new-hotline", "old-night"]
        assert store.search(CallQuery(phrase="坏了很久")).hits == []
        assert store.count("finals") == 2 and store.count("events") == 8
    finally:
        store.close()


def test_a_phrase_is_found_alike_among_the_newest_calls_and_through_the_index(store_url: str) -> None:
    """The newest calls read first (SQLite's window) and the phrase index give the same pages,
    whether the window holds a page (a common phrase) or not (a rare one)."""
    store = open_store(store_url)
    assert isinstance(store, SqlStore)
    try:
        for n in range(30):
            words = "路灯不亮了" if n % 3 else f"幸福路{n}号的路灯不亮了井盖也坏了"
            store.apply(as_json(a_call(f"c{n:02d}", str(n % 2), words, "市政设施/路灯", T0 + n * 1000)))

        def pages(query: CallQuery, window: int) -> list[list[str]]:
            store._phrase_window = window
            out, after = [], None
            while True:
                page = store.search(replace(query, after=after, limit=4))
                out.append([h.call_id for h in page.hits])
                if (after := page.next_after) is None:
                    return out

        for query in (CallQuery(phrase="路灯不亮"), CallQuery(phrase="井盖也坏"), CallQuery(phrase="井盖", agent="1"),
                      CallQuery(phrase="幸福路27号"), CallQuery(phrase="没有的话")):  # fmt: skip
            through_index = pages(query, 0)
            assert pages(query, 3) == pages(query, 2000) == through_index, query
        assert sum(map(len, pages(CallQuery(phrase="路灯不亮"), 3))) == 30
        assert pages(CallQuery(phrase="井盖也坏"), 3) == [["c27", "c24", "c21", "c18"], ["c15", "c12", "c09", "c06"],
                                                          ["c03", "c00"]]  # fmt: skip
    finally:
        store.close()
