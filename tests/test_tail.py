"""``asr-gateway tail`` against a real redis-server."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import pytest
import redis

from kb_hooks import events as ev
from kb_hooks.publisher import Publisher
from kb_hooks.tail import Printer, main
from kb_hooks.types import CallContext
from tests import waiting
from tests.redis_server import RedisServer, free_port, redis_server  # noqa: F401
from tests.test_publisher import CALLER, settings, transcript, wait_until

pytestmark = pytest.mark.timeout(60)
CTX = CallContext("call-9", "x@pbx", "hotline")


def publish(url: str, tmp_path: Path, events: list[ev.Event]) -> None:
    async def run() -> None:
        publisher = Publisher(settings(url, tmp_path))
        await publisher.start()
        await wait_until(lambda: publisher.connected)
        for event in events:
            publisher.submit(event)
        await wait_until(lambda: publisher.published == len(events))
        await publisher.stop()

    asyncio.run(run())


def test_tail_prints_history_of_one_call(redis_server: RedisServer, tmp_path: Path,  # noqa: F811
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    publish(redis_server.url, tmp_path, [
        ev.CallStarted(call=CTX, participants=(CALLER,), metadata={}),
        transcript(CTX, 0, False, "我今天发现井盖破损"),
        transcript(CallContext("other"), 0, False, "别的电话"),
        ev.CallEnded(call=CTX, reason="bye", stats={}),
    ])  # fmt: skip
    assert main(["--redis", redis_server.url, "--call", "call-9", "--from-start", "--no-partials",
                 "--max-events", "3", "--timeout", "10"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert "CALL STARTED" in lines[0] and "▶ 我今天发现井盖破损" in lines[1] and "CALL ENDED reason=bye" in lines[2]

    assert main(["--redis", redis_server.url, "--from-start", "--json", "--max-events", "4", "--timeout", "10"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["call_id"] for e in events] == ["call-9", "call-9", "other", "call-9"]


def test_tail_follows_live_partials_and_finals(redis_server: RedisServer, tmp_path: Path,  # noqa: F811
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(
        ["--redis", redis_server.url, "--max-events", "2", "--timeout", "10"])))  # fmt: skip
    thread.start()
    with redis.Redis.from_url(redis_server.url) as client:  # it subscribes once it knows where the streams end
        waiting.wait_until(lambda: client.pubsub_channels(), 10.0, "tail subscribed to the partials' channel")

    async def run() -> None:
        publisher = Publisher(settings(redis_server.url, tmp_path))
        await publisher.start()
        await wait_until(lambda: publisher.connected)
        publisher.submit(transcript(CTX, 0, True, "我今天"))
        await asyncio.sleep(0.2)  # pacing: the partial (pub/sub) goes out before the final (stream)
        publisher.submit(transcript(CTX, 0, False, "我今天发现"))
        await wait_until(lambda: not thread.is_alive())
        await publisher.stop()

    asyncio.run(run())
    thread.join()
    assert codes == [0]
    out = capsys.readouterr().out
    assert "… 我今天" in out and "▶ 我今天发现" in out


def test_tail_reports_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--redis", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "1"]) == 2
    assert "cannot read from" in capsys.readouterr().err


def test_partials_rewrite_in_place_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    printer = Printer(out, as_json=False, tty=True)
    for event in (transcript(CTX, 0, True, "我今"), transcript(CTX, 0, True, "我今天"),
                  transcript(CTX, 0, False, "我今天发现")):  # fmt: skip
        printer.show(event.to_json())
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "\033[1m▶ 我今天发现" in text


def test_work_orders_and_analytics_print_in_one_line_each() -> None:
    printer = Printer(io.StringIO(), as_json=False, tty=False)
    address = ev.DraftField("新花路12号", "新华路12号", ("新华路",), ("e1", "e2"))
    category = ev.DraftField("市政设施/井盖", None, ("井盖",), ("e1", "e2"))
    draft = ev.WorkorderUpdated(call=CTX, workorder_id=CTX.call_id, revision=2, changed=("address",),
                                fields=ev.WorkorderFields(category=category, address=address))  # fmt: skip
    assert printer.format(draft.to_json()).endswith("WORK ORDER r2 category=市政设施/井盖 · address=新华路12号")
    analytics = ev.CallAnalytics(
        call=CTX, duration_ms=10_000, talk_ms={"agent": 3_000, "caller": 4_500}, non_talk_ms=3_000,
        overlap=ev.Overlap(1, 500, (ev.Interruption("agent", "caller", 1, 500),)), speaking_rate={},
        checks=(ev.RuleCheck("greeting", "greeting", True, "agent", 0, 0, "您好"),
                ev.RuleCheck("address_read_back", "address_read_back", None, None, None, None, None)),
        categories=(ev.CategoryHit("complaint", "投诉", "caller", 1, 4_000, "投诉"),),
    )  # fmt: skip
    assert printer.format(analytics.to_json()).endswith(
        "ANALYTICS talk agent 3.0s caller 4.5s, silence 3.0s, overlaps 1 (0.5s); "
        "checks greeting:ok address_read_back:n/a; categories 投诉"
    )
