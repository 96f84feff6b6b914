"""Context biasing (hotwords): a trie of phrase token sequences with a per-token bonus.

The CTC prefix beam search walks the graph as it appends tokens to a prefix: each token that
continues a phrase earns its bonus (log-domain, added to the score used for pruning), so a
phrase the acoustics half-support survives the beam. When a partial match fails, the bonus
of the unfinished part is taken back; a completed phrase keeps its bonus. Failure follows
Aho-Corasick fail links, so a match may restart inside the failed one (phrases "ABC" and "BD"
on input "ABD" end in the "BD" state with the "BD" bonus).

Scores are a potential: a prefix in state ``s`` carries ``kept + node_score[s]``, where
``node_score[s]`` (the bonus of the tokens matched so far, tentative) is taken back on failure
except ``kept_score[s]``, the bonus of the longest completed phrase that is a prefix of the
path to ``s``. :meth:`ContextGraph.finalize` takes back what is still tentative at the end.

Known limit: a phrase that ends inside a longer partial match as a suffix of it (phrases
"ABC" and "B" on input "ABX") is not credited when the longer match fails.

The graph is also held as flat arrays (:meth:`ContextGraph.arrays`) for the C search.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asr_core.tokens import text_to_tokens

DEFAULT_BONUS = 1.5  # log-domain bonus per matched token where a phrase line names none
ROOT = 0


class HotwordsError(ValueError):
    """A phrase file that cannot be used; the message names ``file:line``."""


@dataclass(frozen=True)
class Phrase:
    """One line of a phrase file: the phrase and its per-token bonus (None: the default)."""

    text: str
    boost: float | None = None
    line: int = field(default=0, compare=False)  # 1-based line in its file, for error messages


def parse_phrases(lines: Iterable[str], source: str = "<hotwords>") -> list[Phrase]:
    """Phrases from lines ``PHRASE`` or ``PHRASE :BOOST``; ``#`` comments and blank lines skipped.

    Raises:
        HotwordsError: a bad boost, naming ``source:line``.
    """
    phrases: list[Phrase] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        boost: float | None = None
        if line.startswith(":"):
            raise HotwordsError(f"{source}:{number}: a boost without a phrase")
        head, sep, tail = line.rpartition(" :")
        if sep:
            try:
                boost = float(tail)
            except ValueError:
                raise HotwordsError(f"{source}:{number}: boost {tail!r} is not a number") from None
            if not np.isfinite(boost) or boost < 0:
                raise HotwordsError(f"{source}:{number}: boost {tail!r} must be finite and >= 0")
            line = head.strip()
        phrases.append(Phrase(line, boost, number))
    return phrases


def load_phrases(path: str | Path) -> list[Phrase]:
    """The phrases of a UTF-8 file, one per line (see :func:`parse_phrases`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise HotwordsError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise HotwordsError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_phrases(text.splitlines(), str(path))


def load_graph(path: str | Path, units: Sequence[str], bonus: float = DEFAULT_BONUS) -> ContextGraph:
    """The context graph of a phrase file spelled in ``units`` (the model's units.txt).

    Raises:
        HotwordsError: a bad line, or a phrase the units cannot spell, naming ``file:line``.
    """
    phrases = load_phrases(path)
    spelled = {}
    for phrase in phrases:
        tokens = text_to_tokens(phrase.text, units)
        if tokens is None:
            raise HotwordsError(f"{path}:{phrase.line}: {phrase.text!r} has characters the model has no unit for")
        spelled[phrase.text] = tokens
    return ContextGraph.from_phrases(phrases, spelled.get, bonus)


class ContextGraph:
    """An Aho-Corasick trie over token sequences; node 0 is the root (no match).

    Per node: ``token``, ``depth``, ``fail`` (the longest proper suffix that is also a trie
    path), ``node_score`` (sum of the per-token bonuses along the path) and ``kept_score``
    (``node_score`` of the deepest phrase end on the path, 0 if none).
    """

    def __init__(self, phrases: Sequence[tuple[Sequence[int], float]]) -> None:
        """Build from (token ids, per-token bonus) pairs; empty sequences are ignored.

        Where two phrases share a prefix, the shared tokens take the larger bonus.
        """
        children: list[dict[int, int]] = [{}]
        self.__dict__["_children"] = children  # the cached property's value, filled here
        token, depth, bonus, is_end = [-1], [0], [0.0], [False]
        for tokens, token_bonus in phrases:
            if not tokens:
                continue
            node = ROOT
            for t in tokens:
                child = children[node].get(int(t))
                if child is None:
                    child = len(token)
                    children[node][int(t)] = child
                    children.append({})
                    token.append(int(t))
                    depth.append(depth[node] + 1)
                    bonus.append(float(token_bonus))
                    is_end.append(False)
                else:
                    bonus[child] = max(bonus[child], float(token_bonus))
                node = child
            is_end[node] = True
        n = len(token)
        self.token = np.asarray(token, dtype=np.int64)  # (N,)
        self.depth = np.asarray(depth, dtype=np.int64)  # (N,)
        self.is_end = np.asarray(is_end, dtype=bool)  # (N,)
        self.node_score = np.zeros(n)  # (N,)
        self.kept_score = np.zeros(n)  # (N,)
        self.fail = np.zeros(n, dtype=np.int64)  # (N,)
        queue: deque[int] = deque([ROOT])  # breadth first: parents and shorter suffixes first
        while queue:
            node = queue.popleft()
            for t, child in self._children[node].items():
                self.node_score[child] = self.node_score[node] + bonus[child]
                self.kept_score[child] = self.node_score[child] if is_end[child] else self.kept_score[node]
                self.fail[child] = ROOT if node == ROOT else self._goto(int(self.fail[node]), t)
                queue.append(child)

    @classmethod
    def from_phrases(
        cls, phrases: Iterable[Phrase], encode: Callable[[str], Sequence[int] | None], bonus: float = DEFAULT_BONUS
    ) -> ContextGraph:
        """Build from text phrases; ``encode`` maps a phrase to token ids (None: cannot be spelled)."""
        pairs = []
        for phrase in phrases:
            tokens = encode(phrase.text)
            if tokens:
                pairs.append((tokens, bonus if phrase.boost is None else phrase.boost))
        return cls(pairs)

    def __getstate__(self) -> dict[str, object]:
        """Arrays only (a 1,000-phrase graph pickles in well under a millisecond for the finals
        process); the children dicts are rebuilt from the flat form on the other side."""
        return {"flat": self.flat, "token": self.token, "depth": self.depth, "is_end": self.is_end}

    def __setstate__(self, state: dict[str, object]) -> None:
        flat = state["flat"]
        assert isinstance(flat, tuple)
        fail, node_score, kept_score = flat[3:]
        self.token, self.depth, self.is_end = state["token"], state["depth"], state["is_end"]  # type: ignore[assignment]
        self.fail, self.node_score, self.kept_score = fail, node_score, kept_score
        self.__dict__["flat"] = flat

    @functools.cached_property
    def _children(self) -> list[dict[int, int]]:
        """Each node's {token: child}; built at construction, or from the flat form on first use
        after unpickling (the C search never needs it)."""
        starts, child_token, child_node = self.flat[:3]
        tokens, nodes = child_token.tolist(), child_node.tolist()
        return [dict(zip(tokens[b:e], nodes[b:e], strict=True)) for b, e in itertools.pairwise(starts.tolist())]

    def __len__(self) -> int:
        """Number of nodes, the root included."""
        return int(self.token.shape[0])

    def _goto(self, state: int, token: int) -> int:
        """The Aho-Corasick transition: the deepest trie node reached from ``state`` by ``token``."""
        while True:
            child = self._children[state].get(token)
            if child is not None:
                return child
            if state == ROOT:
                return ROOT
            state = int(self.fail[state])

    def step(self, state: int, token: int) -> tuple[float, int]:
        """(score delta, next state) for appending ``token`` to a prefix in ``state``.

        Continuing a match earns the token's bonus; a failure takes back the tentative bonus
        (keeping completed phrases) and restarts from the deepest matching suffix.
        """
        child = self._children[state].get(token)
        if child is not None:
            return float(self.node_score[child] - self.node_score[state]), child
        nxt = self._goto(int(self.fail[state]), token) if state != ROOT else ROOT
        return float(self.node_score[nxt] - (self.node_score[state] - self.kept_score[state])), nxt

    def finalize(self, state: int) -> float:
        """Score delta at the end of an utterance: the unfinished part of a match is taken back."""
        return float(self.kept_score[state] - self.node_score[state])

    def score(self, tokens: Iterable[int]) -> float:
        """The finalized bonus of a whole token sequence (what the search gives its prefix)."""
        state, total = ROOT, 0.0
        for t in tokens:
            delta, state = self.step(state, int(t))
            total += delta
        return total + self.finalize(state)

    @functools.cached_property
    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`arrays`, built once per graph (graphs are not changed after construction)."""
        return self.arrays()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flat CSR form for the C search: (child_start (N+1,), child_token (E,), child_node (E,),
        fail (N,), node_score (N,), kept_score (N,)) with each node's children sorted by token."""
        starts = [0]
        child_token: list[int] = []
        child_node: list[int] = []
        for children in self._children:
            for t in sorted(children):
                child_token.append(t)
                child_node.append(children[t])
            starts.append(len(child_token))
        return (
            np.asarray(starts, dtype=np.int64),
            np.asarray(child_token, dtype=np.int64),
            np.asarray(child_node, dtype=np.int64),
            self.fail.copy(),
            self.node_score.copy(),
            self.kept_score.copy(),
        )
