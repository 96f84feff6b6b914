"""Traced rescoring decoder (asr_core/backends/traced_decoder.py): one graph per direction gives
the eager prefix-tree log-probs on every shape, the finals pick the eager winners with it, and
the eager forward runs wherever a graph does not apply."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch

from asr_core.audio_io import read_wav
from asr_core.backends import rescoring_decoder
from asr_core.backends.traced_decoder import TracedTreeDecoder
from asr_core.ctc_search import ctc_prefix_beam_search_topk, ctc_topk
from asr_core.engine import Engine
from asr_core.engine_options import EngineOptions
from asr_core.finals import FinalRequest, FinalResult, FinalSearch, FinalSettings, ProcessFinalSearch
from asr_core.frontend import compute_fbank
from asr_core.model.config import DecoderConfig
from asr_core.model.decoder import BiTransformerDecoder, TransformerDecoder, Tree
from asr_core.model.loader import LoadedModel, load_wenet_model
from asr_core.offline import encode_streaming
from rescoring.packing import PrefixTree, padded_memory, tree_batch
from tests.demo_quality import DEMO_MODEL, SEED_WAV

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "final.pt").is_file(), reason="no bundled demo model")

BEAM = 10
GROUPS = ([0], [0, 1], [1, 2, 3], [3, 2, 1, 0], [2])
"""Utterances rescored together: calls of several (S, N, T') shapes, the first one traced."""

Batch = tuple[torch.Tensor, torch.Tensor, Tree, Tree]
"""memory (S, T', D), memory mask (S, 1, T'), the n-bests' tree and their reversed tree."""


@pytest.fixture(scope="module")
def demo() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(DEMO_MODEL)


@pytest.fixture(scope="module")
def requests(demo: LoadedModel) -> list[FinalRequest]:
    """The bundled hotline recordings' finals requests: 320 ms chunks, 4 left chunks."""
    out = []
    for wav in sorted(SEED_WAV.parent.glob("*.wav")):
        fbank = torch.from_numpy(compute_fbank(read_wav(wav).samples))
        with torch.inference_mode():
            encoder_out, _ = encode_streaming(demo, fbank, 8, 4)
            log_probs = demo.model.ctc_log_probs(encoder_out.unsqueeze(0))[0]
        out.append(FinalRequest(*ctc_topk(log_probs, BEAM), encoder_out))
    assert len(out) == 4
    return out


def batch_of(
    encoder_outs: Sequence[torch.Tensor], nbests: Sequence[Sequence[Sequence[int]]], sos: int, eos: int
) -> Batch:
    memory, mask = padded_memory(encoder_outs)
    trees = [PrefixTree.of([list(h) for h in nbest], sos) for nbest in nbests]
    r_trees = [PrefixTree.of([list(h)[::-1] for h in nbest], sos) for nbest in nbests]
    return memory, mask, tree_batch(trees, eos), tree_batch(r_trees, eos)


def demo_batch(demo: LoadedModel, requests: list[FinalRequest], group: list[int]) -> Batch:
    """The real CTC n-bests of ``group``'s utterances, as ``attention_rescore`` batches them."""
    nbests = [
        [h.tokens for h in ctc_prefix_beam_search_topk(requests[i].topk_values, requests[i].topk_ids, BEAM, 0)]
        for i in group
    ]
    outs = [torch.as_tensor(requests[i].encoder_out) for i in group]
    return batch_of(outs, nbests, demo.sos_id, demo.eos_id)


def assert_same_log_probs(
    traced: TracedTreeDecoder, eager: TransformerDecoder | BiTransformerDecoder, batch: Batch
) -> None:
    with torch.inference_mode():
        expected = eager.forward_tree(*batch)
        got = traced.forward_tree(*batch)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_one_trace_per_direction_gives_the_eager_log_probs_on_every_shape(
    demo: LoadedModel, requests: list[FinalRequest], backend: str
) -> None:
    eager = rescoring_decoder(backend, demo.model.decoder, traced=False)
    traced = rescoring_decoder(backend, demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder) and not isinstance(eager, TracedTreeDecoder)
    shapes = set()
    for group in GROUPS:
        batch = demo_batch(demo, requests, group)
        shapes.add((batch[0].shape[:2], batch[2][0].shape))
        assert_same_log_probs(traced, traced.decoder, batch)
        assert traced.graphs == 2  # traced on the first call, one per direction, then reused
    assert len(shapes) == len(GROUPS)


def tiny_decoder(bidirectional: bool, normalize_before: bool, vocab: int, d_model: int) -> torch.nn.Module:
    conf = DecoderConfig(
        attention_heads=2, linear_units=32, num_blocks=2, r_num_blocks=1, dropout_rate=0.1,
        positional_dropout_rate=0.1, normalize_before=normalize_before,
    )  # fmt: skip
    torch.manual_seed(3)
    if bidirectional:
        return BiTransformerDecoder(vocab, d_model, conf).eval()
    return TransformerDecoder(vocab, d_model, conf, conf.num_blocks).eval()


def random_batch(generator: torch.Generator, streams: int, vocab: int, d_model: int) -> Batch:
    """``streams`` utterances of random lengths with n-bests that differ in a token or two."""
    outs, nbests = [], []
    for _ in range(streams):
        frames = int(torch.randint(3, 40, (1,), generator=generator))
        outs.append(torch.randn(frames, d_model, generator=generator))
        base = torch.randint(1, vocab - 1, (int(torch.randint(1, 9, (1,), generator=generator)),), generator=generator)
        nbest = [base.tolist(), base[:-1].tolist(), [*base.tolist(), 1]]
        nbests.append([h for i, h in enumerate(nbest) if h and h not in nbest[:i]])
    return batch_of(outs, nbests, vocab - 1, vocab - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("normalize_before", [True, False])
@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_a_small_random_decoder_traced_once_matches_eager(
    bidirectional: bool, normalize_before: bool, backend: str
) -> None:
    vocab, d_model = 23, 16
    float_decoder = tiny_decoder(bidirectional, normalize_before, vocab, d_model)
    traced = rescoring_decoder(backend, float_decoder)
    assert isinstance(traced, TracedTreeDecoder)
    generator = torch.Generator().manual_seed(7)
    for streams in (2, 5, 1, 3):
        assert_same_log_probs(traced, traced.decoder, random_batch(generator, streams, vocab, d_model))
    assert traced.graphs == (2 if bidirectional else 1)


def final_search(decoder: torch.nn.Module, demo: LoadedModel) -> FinalSearch:
    settings = FinalSettings.for_model(demo, beam=BEAM, ctc_weight=0.5, reverse_weight=0.3)
    return FinalSearch(decoder, settings, proposer=demo.model.decoder)


def search(decoder: torch.nn.Module, demo: LoadedModel, requests: list[FinalRequest]) -> list[FinalResult]:
    return final_search(decoder, demo).run(requests)


def assert_same_finals(got: list[FinalResult], want: list[FinalResult]) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.rescored is not None and b.rescored is not None
        assert a.rescored.tokens == b.rescored.tokens
        assert [h.nbest_index for h in a.rescored.hypotheses] == [h.nbest_index for h in b.rescored.hypotheses]
        for x, y in zip(a.rescored.hypotheses, b.rescored.hypotheses, strict=True):
            assert x.score == pytest.approx(y.score, abs=1e-4)
            assert x.r2l_score == pytest.approx(y.r2l_score, abs=1e-4)


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_the_finals_pick_the_eager_winners_with_the_eager_scores(
    demo: LoadedModel, requests: list[FinalRequest], backend: str
) -> None:
    expected = search(rescoring_decoder(backend, demo.model.decoder, traced=False), demo, requests)
    traced = rescoring_decoder(backend, demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder)
    for batch in (requests, requests[1:3], requests[::-1]):
        want = expected if batch is requests else search(traced.decoder, demo, batch)
        assert_same_finals(search(traced, demo, batch), want)
    assert traced.graphs == 2


@pytest.mark.parametrize("traced", [True, False])
def test_the_finals_process_rescores_as_told(demo: LoadedModel, requests: list[FinalRequest], traced: bool) -> None:
    local = final_search(rescoring_decoder("torch-int8", demo.model.decoder, traced=not traced), demo)
    remote = ProcessFinalSearch(demo.model.decoder, "torch-int8", local, traced=traced)
    try:
        assert_same_finals(remote.run(requests), local.run(requests))
        assert remote.restarts == 0
    finally:
        remote.close()


def test_a_decoder_the_tracer_cannot_follow_rescores_eagerly(
    demo: LoadedModel, requests: list[FinalRequest], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise RuntimeError("this tracer cannot follow the model")

    traced = rescoring_decoder("torch", demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder)
    monkeypatch.setattr(torch.jit, "trace", refuse)
    with caplog.at_level(logging.ERROR, logger="asr_core.backends.traced_decoder"):
        for group in GROUPS[:3]:
            assert_same_log_probs(traced, demo.model.decoder, demo_batch(demo, requests, group))
    assert traced.graphs == 0
    assert len(attempts) == 2  # once per direction, never again for the same kind of call
    assert "it runs eagerly" in caplog.text


def test_masks_the_fused_kernel_cannot_take_run_eagerly(demo: LoadedModel, requests: list[FinalRequest]) -> None:
    memory, mask, tree, r_tree = demo_batch(demo, requests, [0, 1])
    mask = mask.clone()
    mask[1] = False  # an utterance with no frames: its queries attend nothing (WeNet: zeros)
    traced = rescoring_decoder("torch", demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder)
    assert_same_log_probs(traced, demo.model.decoder, (memory, mask, tree, r_tree))
    assert traced.graphs == 0


def test_calls_with_autograd_run_eagerly(demo: LoadedModel, requests: list[FinalRequest]) -> None:
    batch = demo_batch(demo, requests, [0, 1])
    traced = rescoring_decoder("torch", demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder)
    with torch.no_grad():
        expected = demo.model.decoder.forward_tree(*batch)
    with torch.enable_grad():
        got = traced.forward_tree(*batch)
    assert traced.graphs == 0
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_graphs_warmed_up_on_small_trees_serve_the_real_ones(
    demo: LoadedModel, requests: list[FinalRequest], backend: str
) -> None:
    traced = rescoring_decoder(backend, demo.model.decoder)
    assert isinstance(traced, TracedTreeDecoder)
    traced.warm_up()
    assert traced.graphs == 2
    for group in GROUPS:
        assert_same_log_probs(traced, traced.decoder, demo_batch(demo, requests, group))
    assert traced.graphs == 2


def test_the_engine_option_turns_the_graphs_off(demo: LoadedModel) -> None:
    for traced in (True, False):
        engine = Engine(demo, EngineOptions(max_streams=1, traced_rescoring=traced))
        try:
            assert isinstance(engine.finalizer.local_search.decoder, TracedTreeDecoder) is traced
        finally:
            engine.stop()
