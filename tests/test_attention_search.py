"""Attention proposals for the finals: the decoder's incremental step, its beam search, CTC forward
scores and alignment of arbitrary hypotheses on stored top-k posteriors, and the joint finals
search (CTC n-best plus attention proposals) in ``FinalSearch``, ``Engine`` and ``asr-transcribe``.

The step and the search are checked against the full decoder ``forward`` (brute force over
every short sequence, greedy decoding); the CTC scores against a sum over every alignment.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.backends.quantize import rescoring_decoder
from asr_core.cli_transcribe import main
from asr_core.ctc_search import (
    Hypothesis,
    ctc_prefix_beam_search_topk,
    ctc_scores_topk,
    ctc_token_frames_topk,
    ctc_topk,
)
from asr_core.endpoint import EndpointRules
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.events import Event, Final
from asr_core.finals import (
    PROPOSAL_LENGTH_FACTOR,
    PROPOSAL_LENGTH_SLACK,
    FinalRequest,
    FinalResult,
    FinalSearch,
    FinalSettings,
)
from asr_core.frontend import compute_fbank
from asr_core.model.config import DecoderConfig
from asr_core.model.decoder import BiTransformerDecoder, TransformerDecoder
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming
from asr_core.stream import StreamConfig
from asr_core.tokens import tokens_to_text
from rescoring.attention import attention_rescore
from rescoring.attention_search import AttentionHypothesis, attention_beam_search, supports_search

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO.parent / "shared" / "fixtures" / "wenet_u2pp_small"
DEMO_MODEL = REPO / "asr_core" / "demo_model"
HOTLINE = REPO / "tests" / "data" / "hotline_8k"
needs_fixture = pytest.mark.skipif(not (FIXTURE / "model").is_dir(), reason=f"WeNet fixture not found at {FIXTURE}")
needs_demo = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="bundled demo model not found")

NO_ENDPOINTS = EndpointRules(trailing_silence_ms=10**9, leading_silence_ms=10**9, max_utterance_ms=10**9)
Decoder = TransformerDecoder | BiTransformerDecoder
DECODER_KINDS = [
    pytest.param("fixture", marks=needs_fixture),
    pytest.param("fixture_left", marks=needs_fixture),
    "tiny_post_norm",
    "tiny_bi",
]


# --- helpers ---


@functools.cache
def fixture_model() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


@functools.cache
def demo_model() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(DEMO_MODEL)


def tiny_decoder(
    vocab_size: int, d_model: int = 16, *, seed: int = 0, normalize_before: bool = True, bidirectional: bool = False
) -> Decoder:
    """A small random decoder (no dropout, eval mode), the same for the same arguments."""
    conf = DecoderConfig(
        attention_heads=2, linear_units=32, num_blocks=2, r_num_blocks=1, dropout_rate=0.0,
        positional_dropout_rate=0.0, normalize_before=normalize_before,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        decoder: Decoder = (
            BiTransformerDecoder(vocab_size, d_model, conf)
            if bidirectional
            else TransformerDecoder(vocab_size, d_model, conf, conf.num_blocks)
        )
    return decoder.eval()


def decoder_of(kind: str) -> tuple[Decoder, int, int]:
    """(decoder, d_model, vocab size); sos = eos = vocab size - 1, as in WeNet models."""
    if kind in ("fixture", "fixture_left"):
        loaded = fixture_model()
        decoder = loaded.model.decoder
        assert isinstance(decoder, BiTransformerDecoder)
        assert loaded.sos_id == loaded.eos_id == loaded.vocab_size - 1
        return (decoder if kind == "fixture" else decoder.left_decoder), loaded.d_model, loaded.vocab_size
    if kind == "tiny_post_norm":
        return tiny_decoder(7, normalize_before=False, seed=3), 16, 7
    assert kind == "tiny_bi"
    return tiny_decoder(7, seed=4, bidirectional=True), 16, 7


def padded(frames: list[int], d_model: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Random encoder outputs of the given lengths: (memory (S, T, D) with huge values in the
    padding, which the mask must hide; mask (S, 1, T); the unpadded outputs)."""
    gen = torch.Generator().manual_seed(seed)
    outs = [torch.randn(t, d_model, generator=gen) for t in frames]
    memory = torch.full((len(frames), max(frames), d_model), 1e3)
    for s, out in enumerate(outs):
        memory[s, : len(out)] = out
    mask = (torch.arange(max(frames))[None, :] < torch.tensor(frames)[:, None]).unsqueeze(1)
    return memory, mask, outs


def forward_log_probs(decoder: Decoder, memory: torch.Tensor, mask: torch.Tensor, ys_in: torch.Tensor) -> torch.Tensor:
    """``forward`` on whole sequences, memory row i for sequence i: (N, L, V) log-probs."""
    lens = torch.full((ys_in.shape[0],), ys_in.shape[1], dtype=torch.long)
    with torch.inference_mode():
        log_probs, _ = decoder(memory, mask, ys_in, lens, ys_in, 0.0)
    return log_probs


def sequence_log_prob(decoder: Decoder, memory: torch.Tensor, sos: int, tokens: list[int]) -> list[float]:
    """Per position, log P(tokens[j] | sos, tokens[:j]) by ``forward`` on one utterance (T, D)."""
    ys_in = torch.tensor([[sos, *tokens[:-1]]])
    mask = torch.ones(1, 1, memory.shape[0], dtype=torch.bool)
    log_probs = forward_log_probs(decoder, memory[None], mask, ys_in)[0]
    return [float(log_probs[j, t]) for j, t in enumerate(tokens)]


def brute_force_search(
    decoder: Decoder, memory: torch.Tensor, vocab_size: int, eos: int, max_tokens: int
) -> dict[tuple[int, ...], float]:
    """Every hypothesis the search can end with, scored as it scores them: a sequence shorter
    than ``max_tokens`` ended by eos (eos' log-prob included), or one of exactly ``max_tokens``
    tokens cut there (no eos)."""
    symbols = [t for t in range(vocab_size) if t != eos]
    sequences = [seq for n in range(max_tokens + 1) for seq in itertools.product(symbols, repeat=n)]
    targets = [[*seq, eos] if len(seq) < max_tokens else list(seq) for seq in sequences]
    width = max_tokens + 1
    ys_in = torch.full((len(sequences), width), eos, dtype=torch.long)
    ys_in[:, 0] = eos  # sos
    for i, seq in enumerate(sequences):
        ys_in[i, 1 : len(seq) + 1] = torch.tensor(seq, dtype=torch.long)
    mask = torch.ones(len(sequences), 1, memory.shape[0], dtype=torch.bool)
    log_probs = forward_log_probs(decoder, memory.expand(len(sequences), -1, -1), mask, ys_in).double()
    return {
        seq: float(sum(log_probs[i, j, t] for j, t in enumerate(target)))
        for i, (seq, target) in enumerate(zip(sequences, targets, strict=True))
    }


def greedy_decode(decoder: Decoder, memory: torch.Tensor, sos: int, eos: int, limit: int) -> AttentionHypothesis:
    """Argmax of ``forward``'s last position, one token at a time, until eos or ``limit`` tokens."""
    tokens: list[int] = []
    score = 0.0
    mask = torch.ones(1, 1, memory.shape[0], dtype=torch.bool)
    while len(tokens) < limit:
        log_probs = forward_log_probs(decoder, memory[None], mask, torch.tensor([[sos, *tokens]]))[0, -1].double()
        token = int(log_probs.argmax())
        score += float(log_probs[token])
        if token == eos:
            break
        tokens.append(token)
    return AttentionHypothesis(tuple(tokens), score)


def random_log_softmax(frames: int, vocab_size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=1.5, size=(frames, vocab_size))
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def topk(log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 per-frame top-k, best first."""
    ids = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(log_probs, ids, axis=1), ids


def dense_from_topk(values: np.ndarray, ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """The (T, V) posteriors ``ctc_scores_topk`` documents: top-k kept, the rest share what they leave."""
    k = values.shape[1]
    dense = np.full((values.shape[0], vocab_size), -np.inf)
    if k < vocab_size:
        dense[:] = np.log((1.0 - np.exp(values).sum(axis=1)) / (vocab_size - k))[:, None]
    np.put_along_axis(dense, ids, values, axis=1)
    return dense


def brute_force_ctc(log_probs: np.ndarray, blank: int) -> dict[tuple[int, ...], float]:
    """log P(y) for every label sequence y with an alignment: log-sum over all T^V paths."""
    frames, vocab_size = log_probs.shape
    paths: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for path in itertools.product(range(vocab_size), repeat=frames):
        collapsed = tuple(t for i, t in enumerate(path) if t != blank and (i == 0 or path[i - 1] != t))
        paths[collapsed].append(float(sum(log_probs[t, u] for t, u in enumerate(path))))
    return {label: float(np.logaddexp.reduce(scores)) for label, scores in paths.items()}


def final_request(loaded: LoadedModel, wav: Path, beam: int = 10) -> FinalRequest:
    """One utterance as the engine finalizes it: 320 ms chunks, 4 left chunks, CTC top-``beam``."""
    fbank = torch.from_numpy(compute_fbank(read_wav(wav).samples))
    with torch.inference_mode():
        encoder_out, _ = encode_streaming(loaded, fbank, 8, 4)
        log_probs = loaded.model.ctc_log_probs(encoder_out.unsqueeze(0))[0]
    return FinalRequest(*ctc_topk(log_probs, beam), encoder_out)


def settings_for(loaded: LoadedModel, attention_beam: int) -> FinalSettings:
    return FinalSettings.for_model(loaded, beam=10, ctc_weight=0.5, reverse_weight=0.3, attention_beam=attention_beam)


def assert_times_fit(times: tuple[int, ...], tokens: tuple[int, ...], frames: int) -> None:
    assert len(times) == len(tokens)
    assert all(a < b for a, b in itertools.pairwise(times))
    assert all(0 <= t < frames for t in times)


# --- TransformerDecoder.step ---


@pytest.mark.parametrize("reorder", [False, True], ids=["in_order", "reordered"])
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_step_equals_forward_at_every_position(kind: str, reorder: bool) -> None:
    """Tokens fed one at a time through ``step`` (cache carried, and with ``reorder`` its rows
    gathered between steps as beam search does) give each row the log-probs ``forward`` gives
    on the row's whole prefix; several rows share a memory row whose padding is masked."""
    decoder, d_model, vocab_size = decoder_of(kind)
    sos = vocab_size - 1
    memory, mask, _ = padded([9, 5], d_model, seed=1)
    rows = torch.tensor([0, 1, 0, 1, 1])
    count, length = len(rows), 6
    gen = torch.Generator().manual_seed(2)
    next_tokens = torch.randint(0, vocab_size, (count, length), generator=gen)
    next_tokens[:, 0] = sos
    prefixes = next_tokens[:, :1]
    memory_kv = decoder.memory_keys_values(memory)
    cache: list[torch.Tensor] | None = None
    outputs = []
    with torch.inference_mode():
        for position in range(length):
            log_probs, cache = decoder.step(memory_kv, mask, prefixes[:, -1], cache, rows)
            assert log_probs.shape == (count, vocab_size)
            assert all(c.shape[0] == count and c.shape[2] == position + 1 for c in cache)
            expected = forward_log_probs(decoder, memory[rows], mask[rows], prefixes)[:, -1]
            torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)
            outputs.append(log_probs)
            if position + 1 == length:
                break
            if reorder:  # rows follow their parents: some duplicated, some dropped, order changed
                parents = torch.roll(torch.tensor([2, 2, 0, 4, 1]), position)
                cache = [c.index_select(0, parents) for c in cache]
                rows, prefixes = rows[parents], prefixes[parents]
            prefixes = torch.cat([prefixes, next_tokens[:, position + 1 : position + 2]], dim=1)
    if not reorder:  # one forward on the whole sequences gives every position at once
        whole = forward_log_probs(decoder, memory[rows], mask[rows], prefixes)
        torch.testing.assert_close(torch.stack(outputs, dim=1), whole, atol=1e-5, rtol=0)


@needs_fixture
def test_bidirectional_step_is_the_left_decoders() -> None:
    decoder = fixture_model().model.decoder
    assert isinstance(decoder, BiTransformerDecoder)
    memory, mask, _ = padded([6, 4], fixture_model().d_model, seed=5)
    rows = torch.tensor([1, 0, 1])
    tokens = torch.tensor([59, 59, 59])
    with torch.inference_mode():
        kv = decoder.memory_keys_values(memory)
        left_kv = decoder.left_decoder.memory_keys_values(memory)
        for (k, v), (left_k, left_v) in zip(kv, left_kv, strict=True):
            assert torch.equal(k, left_k) and torch.equal(v, left_v)
        log_probs, cache = decoder.step(kv, mask, tokens, None, rows)
        left_log_probs, left_cache = decoder.left_decoder.step(left_kv, mask, tokens, None, rows)
    assert torch.equal(log_probs, left_log_probs)
    assert len(cache) == 2 * len(decoder.left_decoder.decoders) == len(left_cache)  # keys and values per layer


# --- attention_beam_search ---


@pytest.mark.parametrize(("vocab_size", "max_tokens"), [(5, [3, 2]), (4, [4, 1])])
def test_a_wide_beam_finds_every_hypothesis_and_the_best(vocab_size: int, max_tokens: list[int]) -> None:
    """With a beam wider than all candidates, the search ends with every sequence of at most
    ``max_tokens`` tokens, each scored as the full forward scores it, and its best is the best
    of a brute force over all of them. Two utterances, each with its own limit."""
    decoder = tiny_decoder(vocab_size, seed=vocab_size)
    eos = vocab_size - 1
    _, _, outs = padded([6, 3], 16, seed=vocab_size)
    beam = 128  # > (vocab_size - 1) ** max_tokens * vocab_size candidates at the last step
    found = attention_beam_search(decoder, outs, beam, sos=eos, eos=eos, max_tokens=max_tokens)
    assert len(found) == 2
    for hyps, out, limit in zip(found, outs, max_tokens, strict=True):
        expected = brute_force_search(decoder, out, vocab_size, eos, limit)
        assert len(hyps) == len(expected)
        assert {h.tokens for h in hyps} == set(expected)
        for h in hyps:
            assert h.score == pytest.approx(expected[h.tokens], abs=1e-4)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        best = max(expected, key=lambda tokens: expected[tokens])
        assert hyps[0].tokens == best
        assert hyps[0].score == pytest.approx(expected[best], abs=1e-4)


@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_utterances_searched_together_equal_each_searched_alone(kind: str) -> None:
    decoder, d_model, vocab_size = decoder_of(kind)
    eos = vocab_size - 1
    _, _, outs = padded([7, 12, 4], d_model, seed=11)
    together = attention_beam_search(decoder, outs, 4, sos=eos, eos=eos)
    assert len(together) == 3
    for out, hyps in zip(outs, together, strict=True):
        (alone,) = attention_beam_search(decoder, [out], 4, sos=eos, eos=eos)
        assert 1 <= len(hyps) <= 4
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        np.testing.assert_allclose([h.score for h in hyps], [h.score for h in alone], atol=1e-4, rtol=0)
        assert all(len(h.tokens) <= len(out) for h in hyps)  # default limit: the frame count


@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_beam_one_is_greedy_decoding(kind: str) -> None:
    decoder, d_model, vocab_size = decoder_of(kind)
    eos = vocab_size - 1
    _, _, outs = padded([8, 5, 11], d_model, seed=13)
    limits = [8, 3, 6]
    found = attention_beam_search(decoder, outs, 1, sos=eos, eos=eos, max_tokens=limits)
    for out, limit, hyps in zip(outs, limits, found, strict=True):
        expected = greedy_decode(decoder, out, eos, eos, limit)
        (hyp,) = hyps
        assert hyp.tokens == expected.tokens
        assert hyp.score == pytest.approx(expected.score, abs=1e-4)
        # the search's score is the forward's sum over the tokens (+ eos unless cut at the limit)
        targets = list(hyp.tokens) if len(hyp.tokens) == limit else [*hyp.tokens, eos]
        assert hyp.score == pytest.approx(sum(sequence_log_prob(decoder, out, eos, targets)), abs=1e-4)


def test_search_arguments_are_validated() -> None:
    decoder = tiny_decoder(5)
    out = torch.zeros(4, 16)
    with pytest.raises(ValueError, match="beam must be >= 1"):
        attention_beam_search(decoder, [out], 0, sos=4, eos=4)
    assert attention_beam_search(decoder, [], 3, sos=4, eos=4) == []
    with pytest.raises(ValueError, match="1 encoder outputs but 2 token limits"):
        attention_beam_search(decoder, [out], 3, sos=4, eos=4, max_tokens=[2, 2])


def test_no_tokens_allowed_or_no_frames_means_no_proposals() -> None:
    decoder = tiny_decoder(5)
    out = torch.randn(4, 16)
    assert attention_beam_search(decoder, [out, out], 3, sos=4, eos=4, max_tokens=[0, 2])[0] == []
    assert attention_beam_search(decoder, [torch.zeros(0, 16), out], 3, sos=4, eos=4)[0] == []
    assert all(len(h.tokens) <= 2 for h in attention_beam_search(decoder, [out], 3, sos=4, eos=4, max_tokens=[2])[0])


def test_joint_finals_of_an_utterance_without_frames() -> None:
    """Too little audio for one encoder frame: the CTC scores of an empty utterance, no crash."""
    assert ctc_scores_topk(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64), [(), (1,)], 5) == [0.0, -math.inf]
    loaded = fixture_model()
    request = FinalRequest(np.zeros((0, 10), np.float32), np.zeros((0, 10), np.int64), torch.zeros(0, loaded.d_model))
    (result,) = FinalSearch(loaded.model.decoder, settings_for(loaded, attention_beam=4)).run([request])
    assert result.rescored is None or result.rescored.tokens == ()


def test_proposals_need_the_vocabulary_size() -> None:
    loaded = fixture_model()
    with pytest.raises(ValueError, match="needs vocab_size"):
        FinalSearch(loaded.model.decoder, replace(settings_for(loaded, attention_beam=4), vocab_size=0))


def test_supports_search_knows_which_decoders_can_step() -> None:
    bi = tiny_decoder(5, bidirectional=True)
    assert isinstance(bi, BiTransformerDecoder)
    assert supports_search(bi) and supports_search(bi.left_decoder) and supports_search(tiny_decoder(5))

    def plain(*args: Any, **kwargs: Any) -> None:
        return None

    assert not supports_search(plain)
    assert not supports_search(object())


@needs_fixture
def test_supports_search_on_the_fixture_model() -> None:
    decoder = fixture_model().model.decoder
    assert isinstance(decoder, BiTransformerDecoder)
    assert supports_search(decoder) and supports_search(decoder.left_decoder)


# --- CTC forward scores and alignments on stored top-k ---


@pytest.mark.parametrize("blank", [0, 2])
@pytest.mark.parametrize("k", [4, 2], ids=["exact", "top2"])
def test_ctc_scores_topk_equal_the_sum_over_all_alignments(k: int, blank: int) -> None:
    frames, vocab_size = 5, 4
    values, ids = topk(random_log_softmax(frames, vocab_size, seed=17 + blank), k)
    dense = dense_from_topk(values, ids, vocab_size)
    expected = brute_force_ctc(dense, blank)
    assert float(np.logaddexp.reduce(list(expected.values()))) == pytest.approx(0.0, abs=1e-9)
    symbols = [t for t in range(vocab_size) if t != blank]
    a, b = symbols[0], symbols[1]
    repeats = [(a, a), (a, a, a), (a, b, a, b, a), (b, b, a)]  # a repeated token needs a blank between
    impossible = [(a, a, a, a), (a, b, a, b, a, b), (b, b, b, a, a)]  # more frames needed than there are
    assert all(r in expected for r in repeats) and not any(i in expected for i in impossible)
    hyps = [*expected, *impossible]
    scores = ctc_scores_topk(values, ids, hyps, vocab_size, blank)
    assert len(scores) == len(hyps)
    for hyp, score in zip(hyps, scores, strict=True):
        if hyp in expected:
            assert score == pytest.approx(expected[hyp], abs=1e-9), hyp
        else:
            assert score == -math.inf, hyp
    assert ctc_scores_topk(values, ids, [], vocab_size, blank) == []


@pytest.mark.parametrize("blank", [0, 3])
def test_ctc_scores_topk_equal_an_unpruned_prefix_beam_search(blank: int) -> None:
    """With every token kept per frame and a beam wider than all prefixes (tiny T), the prefix
    search's score of each prefix is its total probability, the same as the forward's."""
    frames, vocab_size = 5, 4
    log_probs = random_log_softmax(frames, vocab_size, seed=23 + blank)
    values, ids = ctc_topk(log_probs, vocab_size)
    hyps = ctc_prefix_beam_search_topk(values, ids, beam=1000, blank=blank)
    # Nothing was pruned: every alignable sequence is there (the beam, wider than them all, also
    # keeps prefixes no alignment reaches, at -inf).
    assert {h.tokens for h in hyps if h.score > -math.inf} == set(brute_force_ctc(log_probs, blank))
    scores = ctc_scores_topk(values, ids, [h.tokens for h in hyps], vocab_size, blank)
    np.testing.assert_allclose(scores, [h.score for h in hyps], atol=1e-6, rtol=0)


def peaky_posteriors(frames: int, vocab_size: int, peaks: dict[int, int]) -> np.ndarray:
    """Blank-dominated log-posteriors; ``peaks`` maps a frame to the token peaking there, which
    also leads (less strongly) on the frames either side, so an alignment spans three frames."""
    probs = np.full((frames, vocab_size), 0.15 / (vocab_size - 1))
    probs[:, 0] = 0.85
    for frame, token in peaks.items():
        for t, p in ((frame - 1, 0.6), (frame, 0.9), (frame + 1, 0.6)):
            probs[t] = (1.0 - p) / (vocab_size - 1)
            probs[t, token] = p
    return np.log(probs)


@pytest.mark.parametrize("k", [5, 2])
def test_token_frames_are_the_peaks_of_the_best_alignment(k: int) -> None:
    peaks = {2: 2, 5: 3, 9: 3, 12: 1}  # the repeated 3 is split by a blank at frame 7
    frames, vocab_size = 14, 5
    values, ids = ctc_topk(peaky_posteriors(frames, vocab_size, peaks), k)
    tokens = tuple(peaks.values())
    times = ctc_token_frames_topk(values, ids, tokens, vocab_size)
    assert times == tuple(peaks)
    assert_times_fit(times, tokens, frames)
    assert ctc_token_frames_topk(values, ids, list(tokens), vocab_size) == times
    assert ctc_token_frames_topk(values, ids, (), vocab_size) == ()
    assert ctc_token_frames_topk(values, ids, (1,) * 8, vocab_size) == ()  # needs 15 frames
    assert_times_fit(ctc_token_frames_topk(values, ids, (1,) * 7, vocab_size), (1,) * 7, frames)  # fits in 13


def test_token_frames_fit_any_alignable_hypothesis() -> None:
    frames, vocab_size = 9, 6
    rng = np.random.default_rng(29)
    values, ids = ctc_topk(random_log_softmax(frames, vocab_size, seed=29), 3)
    for _ in range(20):
        tokens = tuple(int(t) for t in rng.integers(1, vocab_size, size=int(rng.integers(1, 6))))
        (score,) = ctc_scores_topk(values, ids, [tokens], vocab_size)
        times = ctc_token_frames_topk(values, ids, tokens, vocab_size)
        if score == -math.inf:
            assert times == ()
        else:
            assert_times_fit(times, tokens, frames)


# --- FinalSearch with proposals ---


@needs_fixture
def test_final_search_without_proposals_is_attention_rescoring_of_the_ctc_nbest() -> None:
    loaded = fixture_model()
    requests = [final_request(loaded, FIXTURE / "wav" / name) for name in ("utt1.wav", "utt2.wav")]
    results = FinalSearch(loaded.model.decoder, settings_for(loaded, 0)).run(requests)
    nbests = [ctc_prefix_beam_search_topk(r.topk_values, r.topk_ids, 10, loaded.blank_id) for r in requests]
    expected = attention_rescore(
        loaded.model.decoder, [encoder_out_of(r) for r in requests], nbests, sos=loaded.sos_id, eos=loaded.eos_id,
        ctc_weight=0.5, reverse_weight=0.3,
    )  # fmt: skip
    assert [r.nbest for r in results] == nbests
    assert [r.rescored for r in results] == expected  # the same batch: the very same floats


def encoder_out_of(request: FinalRequest) -> torch.Tensor:
    out = request.encoder_out
    assert isinstance(out, torch.Tensor)
    return out


@needs_fixture
def test_final_search_with_proposals_adds_them_to_the_ctc_nbest() -> None:
    """The rescored list holds the whole CTC n-best plus the attention search's proposals CTC
    can align, each with its CTC forward score; its winner scores at least the plain rescoring's
    (the forward sums every alignment, the prefix search only those its beam kept)."""
    loaded = fixture_model()
    requests = [final_request(loaded, FIXTURE / "wav" / name) for name in ("utt1.wav", "utt2.wav")]
    plain = FinalSearch(loaded.model.decoder, settings_for(loaded, 0)).run(requests)
    joint = FinalSearch(loaded.model.decoder, settings_for(loaded, 4)).run(requests)
    for request, before, after in zip(requests, plain, joint, strict=True):
        values, ids, out = request.topk_values, request.topk_ids, encoder_out_of(request)
        assert after.nbest == before.nbest
        assert after.rescored is not None and before.rescored is not None
        nbest = [h.tokens for h in after.nbest]
        limit = min(len(out), PROPOSAL_LENGTH_FACTOR * max(len(t) for t in nbest) + PROPOSAL_LENGTH_SLACK)
        (proposals,) = attention_beam_search(
            loaded.model.decoder, [out], 4, sos=loaded.sos_id, eos=loaded.eos_id, max_tokens=[limit]
        )
        proposal_scores = ctc_scores_topk(values, ids, [p.tokens for p in proposals], loaded.vocab_size)
        alignable = [p.tokens for p, score in zip(proposals, proposal_scores, strict=True) if score > -math.inf]
        members = [h.tokens for h in after.rescored.hypotheses]
        assert len(set(members)) == len(members)
        assert set(members) == set(nbest) | set(alignable)
        assert len(members) > len(nbest)  # the fixture's decoder proposes sequences CTC did not
        assert [h.score for h in after.rescored.hypotheses] == sorted(
            (h.score for h in after.rescored.hypotheses), reverse=True
        )
        forward = dict(zip(members, ctc_scores_topk(values, ids, members, loaded.vocab_size), strict=True))
        prefix = {h.tokens: h.score for h in after.nbest}
        for h in after.rescored.hypotheses:
            assert h.ctc_score == pytest.approx(forward[h.tokens], abs=1e-9)
            if h.tokens in prefix:
                assert h.ctc_score >= prefix[h.tokens] - 1e-6
        assert after.rescored.score >= before.rescored.score - 1e-3
        assert after.rescored.tokens == after.rescored.hypotheses[0].tokens
        assert_times_fit(after.rescored.times, after.rescored.tokens, len(out))


@needs_fixture
def test_the_proposer_proposes_and_the_decoder_rescores() -> None:
    """With a separate proposer (the int8 backends: the float decoder searches, the int8 copy
    rescores), the candidates are the CTC n-best plus the proposer's proposals, and every score
    is the rescoring decoder's."""
    loaded = fixture_model()
    requests = [final_request(loaded, FIXTURE / "wav" / name) for name in ("utt1.wav", "utt2.wav")]
    float_decoder = loaded.model.decoder
    int8_decoder = rescoring_decoder("torch-int8", float_decoder)
    results = FinalSearch(int8_decoder, settings_for(loaded, 4), proposer=float_decoder).run(requests)
    outs = [encoder_out_of(r) for r in requests]
    candidates = []
    for request, result, out in zip(requests, results, outs, strict=True):
        nbest = [h.tokens for h in result.nbest]
        limit = min(len(out), PROPOSAL_LENGTH_FACTOR * max(len(t) for t in nbest) + PROPOSAL_LENGTH_SLACK)
        (proposals,) = attention_beam_search(
            float_decoder, [out], 4, sos=loaded.sos_id, eos=loaded.eos_id, max_tokens=[limit]
        )
        members = nbest + [p.tokens for p in proposals if p.tokens not in nbest]
        scores = ctc_scores_topk(request.topk_values, request.topk_ids, members, loaded.vocab_size)
        candidates.append(
            [Hypothesis(t, score, (), 0.0) for t, score in zip(members, scores, strict=True) if score > -math.inf]
        )
    expected = attention_rescore(
        int8_decoder, outs, candidates, sos=loaded.sos_id, eos=loaded.eos_id, ctc_weight=0.5, reverse_weight=0.3
    )
    for result, want in zip(results, expected, strict=True):
        assert result.rescored is not None
        got = {h.tokens: (h.l2r_score, h.r2l_score) for h in result.rescored.hypotheses}
        assert got == {h.tokens: (h.l2r_score, h.r2l_score) for h in want.hypotheses}
        assert result.rescored.tokens == want.tokens


@needs_demo
def test_joint_finals_on_the_demo_model_read_the_reference_text() -> None:
    """With a CTC n-best of one, the demo model's CTC reads hotline_3 wrong (口器 for 口气); the
    decoder's own proposal has the right transcript, wins the rescoring, and is aligned for token
    times. (With WeNet's n-best of 10 the right transcript is among the CTC hypotheses.)"""
    loaded = demo_model()
    request = final_request(loaded, HOTLINE / "hotline_3.wav", beam=1)
    references = dict(line.split(maxsplit=1) for line in (HOTLINE / "text").read_text(encoding="utf-8").splitlines())
    settings = FinalSettings.for_model(loaded, beam=1, ctc_weight=0.5, reverse_weight=0.3, attention_beam=4)
    (result,) = FinalSearch(loaded.model.decoder, settings).run([request])
    assert isinstance(result, FinalResult) and result.rescored is not None
    winner = result.rescored
    assert tokens_to_text(result.nbest[0].tokens, loaded.units) != references["hotline_3"].strip()
    assert tokens_to_text(winner.tokens, loaded.units) == references["hotline_3"].strip()
    assert winner.tokens not in [h.tokens for h in result.nbest]
    assert winner.times == ctc_token_frames_topk(
        request.topk_values, request.topk_ids, winner.tokens, loaded.vocab_size, loaded.blank_id
    )
    assert_times_fit(winner.times, winner.tokens, len(encoder_out_of(request)))


# --- Engine and asr-transcribe agree ---


@needs_fixture
def test_engine_finals_equal_asr_transcribe_joint(capsys: pytest.CaptureFixture[str]) -> None:
    loaded = fixture_model()
    wavs = [FIXTURE / "wav" / name for name in ("utt1.wav", "utt2.wav")]
    engine = Engine(loaded, EngineOptions(max_streams=4, attention_beam=4, endpoint=NO_ENDPOINTS))
    events: dict[str, list[Event]] = defaultdict(list)
    streams = []
    for i, wav in enumerate(wavs):
        stream = engine.open_stream(
            StreamConfig(chunk_ms=320, left_chunks=4, stream_id=f"j{i}"), lambda e: events[e.stream_id].append(e)
        )
        stream.accept_waveform(read_wav(wav).samples)
        stream.input_finished()
        streams.append(stream)
    for _ in range(100_000):
        if all(s.done.is_set() for s in streams):
            break
        engine.run_once()
    assert all(s.done.is_set() for s in streams)

    args = ["--mode", "joint", "--chunk-ms", "320", "--left-chunks", "4", "--attention-beam", "4", "--json"]
    code = main([*map(str, wavs), "--model", str(FIXTURE / "model"), *args])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len(wavs)
    for i, cli in enumerate(lines):
        (final,) = [e for e in events[f"j{i}"] if isinstance(e, Final)]
        assert cli["mode"] == "joint"
        assert final.tokens == tuple(cli["tokens"])
        assert len(final.nbest) > 10  # the n-best of 10 plus proposals
        cli_scores = {tuple(e["tokens"]): e["score"] for e in cli["nbest"]}
        assert {e.tokens for e in final.nbest} == set(cli_scores)
        for entry in final.nbest:
            assert entry.score == pytest.approx(cli_scores[entry.tokens], abs=max(1e-3, 1e-5 * abs(entry.score)))
