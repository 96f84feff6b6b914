"""The gateway's hotword lists: loaded per profile file, reloaded on change, a broken file keeps
the previous graph; the route profile field; the stream config carries the graph to finals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asr_core.context_graph import ContextGraph
from asr_core.finals import FinalRequest
from asr_gateway.hotwords import HotwordLists
from calls.profile import Profile

UNITS = ["<blank>", "<unk>", "新", "华", "路", "号"]


def test_sync_get_and_reload(tmp_path: Path) -> None:
    (tmp_path / "streets.txt").write_text("新华路\n", encoding="utf-8")
    lists = HotwordLists(UNITS, tmp_path)
    assert lists.sync(["streets.txt"]) == []
    graph = lists.get("streets.txt")
    assert graph is not None and graph.score([2, 3, 4]) > 0
    assert lists.get(None) is None and lists.get("other.txt") is None
    assert lists.files() == [tmp_path / "streets.txt"]

    (tmp_path / "streets.txt").write_text("新华路 :x\n", encoding="utf-8")  # broken: previous kept
    (result,) = lists.reload_all().values()
    assert not result.ok and "streets.txt:1: boost 'x'" in result.errors[0]
    assert lists.get("streets.txt") is graph

    (tmp_path / "streets.txt").write_text("新华路 :2\n号\n", encoding="utf-8")
    (result,) = lists.reload_all().values()
    assert result.ok and result.changed
    updated = lists.get("streets.txt")
    assert updated is not graph and updated is not None and updated.score([5]) > 0


def test_sync_reports_problems_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("新\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_text("新\nXYZ\n", encoding="utf-8")
    lists = HotwordLists(UNITS, tmp_path)
    assert lists.sync(["a.txt"]) == []
    problems = lists.sync(["a.txt", "bad.txt", "missing.txt"])
    assert any("bad.txt:2: 'XYZ'" in p for p in problems)
    assert any("missing.txt: cannot read" in p for p in problems)
    assert lists.files() == [tmp_path / "a.txt"]
    assert lists.sync([]) == [] and lists.files() == []  # no longer named: forgotten


def test_profile_field_and_requests_carry_the_graph() -> None:
    assert Profile().hotwords is None
    assert Profile(hotwords="streets.txt").hotwords == "streets.txt"
    assert not Profile().itn and Profile(itn=True).itn
    graph = ContextGraph([((2, 3), 1.0)])
    request = FinalRequest(np.zeros((1, 2), np.float32), np.zeros((1, 2), np.int64), None, graph)
    assert request.portable().context is graph
