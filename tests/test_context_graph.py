"""The hotword context graph on hand-checked cases: bonus, take-back, overlapping phrases,
phrases that are prefixes of others, and the phrase-file loader's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_core.context_graph import ROOT, ContextGraph, HotwordsError, Phrase, load_phrases, parse_phrases

A, B, C, D, X = 1, 2, 3, 4, 9


def walk(graph: ContextGraph, tokens: list[int]) -> tuple[list[float], int]:
    state, deltas = ROOT, []
    for t in tokens:
        delta, state = graph.step(state, t)
        deltas.append(delta)
    return deltas, state


def test_bonus_per_matched_token_and_kept_when_complete() -> None:
    graph = ContextGraph([((A, B, C), 2.0)])
    deltas, state = walk(graph, [A, B, C])
    assert deltas == [2.0, 2.0, 2.0]
    assert graph.finalize(state) == 0.0  # a completed phrase keeps its bonus
    assert graph.score([X, A, B, C, X]) == 6.0


def test_take_back_when_a_partial_match_fails() -> None:
    graph = ContextGraph([((A, B, C), 2.0)])
    deltas, state = walk(graph, [A, B, X])
    assert deltas == [2.0, 2.0, -4.0] and state == ROOT
    _, state = walk(graph, [A, B])
    assert graph.finalize(state) == -4.0  # unfinished at the end of the utterance
    assert graph.score([A, B]) == 0.0


def test_failure_restarts_at_the_matching_token() -> None:
    graph = ContextGraph([((A, B), 1.0)])
    deltas, _ = walk(graph, [A, A, B])  # the second A fails the match and starts a new one
    assert deltas == [1.0, 0.0, 1.0]
    assert graph.score([A, A, B]) == 2.0


def test_overlapping_phrases_follow_fail_links() -> None:
    graph = ContextGraph([((A, B, C), 1.0), ((B, D), 3.0)])
    deltas, state = walk(graph, [A, B, D])
    # A B earns 2, D fails ABC and lands in BD: total must be BD's bonus 6.
    assert deltas == [1.0, 1.0, 4.0]
    assert sum(deltas) == 6.0 and graph.finalize(state) == 0.0
    assert graph.score([A, B, C, B, D]) == 3.0 + 6.0


def test_phrase_that_is_a_prefix_of_another() -> None:
    graph = ContextGraph([((A, B), 1.0), ((A, B, C, D), 1.0)])
    assert graph.score([A, B, C, D]) == 4.0  # the longer one
    assert graph.score([A, B, C, X]) == 2.0  # the longer fails, the shorter one is kept
    assert graph.score([A, B, C]) == 2.0  # unfinished at the end: likewise
    assert graph.score([A, B]) == 2.0
    deltas, state = walk(graph, [A, B, C, X])
    assert deltas == [1.0, 1.0, 1.0, -1.0] and state == ROOT


def test_shared_prefix_takes_the_larger_bonus() -> None:
    graph = ContextGraph([((A, B), 1.0), ((A, C), 3.0)])
    assert graph.score([A, C]) == 6.0
    assert graph.score([A, B]) == 4.0


def test_empty_graph_and_empty_phrases() -> None:
    graph = ContextGraph([((), 2.0)])
    assert len(graph) == 1
    assert graph.step(ROOT, A) == (0.0, ROOT)
    assert graph.finalize(ROOT) == 0.0


def test_arrays_are_a_csr_of_the_trie() -> None:
    graph = ContextGraph([((A, B), 1.0), ((A, C), 1.0), ((B,), 2.0)])
    starts, tokens, nodes, *_ = graph.arrays()
    assert starts.shape[0] == len(graph) + 1 and tokens.shape == nodes.shape
    for state in range(len(graph)):
        for t in (A, B, C, X):
            found = [int(nodes[e]) for e in range(starts[state], starts[state + 1]) if tokens[e] == t]
            assert found == ([graph.step(state, t)[1]] if graph._children[state].get(t) else [])
    assert list(tokens[starts[0] : starts[1]]) == [A, B]  # sorted by token


def test_from_phrases_uses_the_default_or_the_line_boost() -> None:
    spell = {"ab": [A, B], "c": [C]}
    graph = ContextGraph.from_phrases([Phrase("ab"), Phrase("c", 0.5), Phrase("zz")], spell.get, bonus=2.0)
    assert graph.score([A, B]) == 4.0 and graph.score([C]) == 0.5


def test_parse_phrases() -> None:
    lines = ["# streets", "", "新华路", "  中山 东路 :2.5 ", "HELLO WORLD :0"]
    assert parse_phrases(lines) == [Phrase("新华路"), Phrase("中山 东路", 2.5), Phrase("HELLO WORLD", 0.0)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("新华路 :x", r"hw\.txt:2: boost 'x' is not a number"),
        ("新华路 :-1", r"hw\.txt:2: boost '-1' must be"),
        (" :2", r"hw\.txt:2: a boost without"),
    ],
)
def test_phrase_file_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "hw.txt"
    path.write_text(f"ok\n{line}\n", encoding="utf-8")
    with pytest.raises(HotwordsError, match=message):
        load_phrases(path)


def test_phrase_file_unreadable(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(HotwordsError, match="not UTF-8"):
        load_phrases(bad)
    with pytest.raises(HotwordsError, match="cannot read"):
        load_phrases(tmp_path / "missing.txt")


def test_pickle_round_trip_keeps_steps_and_arrays() -> None:
    import pickle

    graph = ContextGraph([((A, B, C), 1.0), ((B, D), 3.0), ((A, B), 0.5)])
    copy = pickle.loads(pickle.dumps(graph))
    for tokens in ([A, B, D], [A, B, C, X], [B, D, A, B], [X, A]):
        assert copy.score(tokens) == graph.score(tokens)
    for mine, theirs in zip(copy.arrays(), graph.arrays(), strict=True):
        assert (mine == theirs).all()
