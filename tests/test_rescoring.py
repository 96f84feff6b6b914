"""Attention rescoring: WeNet's winners and per-hypothesis scores from the golden fixture, and
batching over streams equal to rescoring each stream alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asr_core.ctc_search import Hypothesis
from asr_core.model.attention import MultiHeadedAttention, RowPacking
from rescoring.attention import attention_rescore
from rescoring.packing import PrefixTree, build_decoder_batch, length_groups, tree_batch

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "decoding.json").exists(), reason=f"golden fixture not found at {FIXTURE}"
)
CASES = [("utt1", "full"), ("utt1", "stream_c8_l-1"), ("utt2", "full"), ("utt2", "stream_c8_l-1")]
SOS = EOS = 59


def score_ok(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-3, 1e-5 * abs(b))


@pytest.fixture(scope="module")
def decoding() -> dict[str, Any]:
    with open(FIXTURE / "decoding.json", encoding="utf-8") as f:
        result: dict[str, Any] = json.load(f)
    return result


def nbest_of(decoding: dict[str, Any], utt: str, mode: str) -> list[Hypothesis]:
    beam = decoding[utt][mode]["ctc_prefix_beam_search"]
    return [
        Hypothesis(tuple(tokens), score, tuple(times))
        for tokens, score, times in zip(beam["nbest"], beam["nbest_scores"], beam["nbest_times"], strict=True)
    ]


class StoredDecoder:
    """Stands in for the decoder: returns WeNet's stored log-probs for each input row.

    Rows are matched by stream (case k has memory filled with the value k) and token sequence;
    padding positions get random values so that a scorer reading past a hypothesis' end fails.
    """

    def __init__(self, decoding: dict[str, Any], cases: list[tuple[str, str]]) -> None:
        arrays = np.load(FIXTURE / "expected.npz")
        self.rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        for case, (utt, mode) in enumerate(cases):
            l2r = arrays[f"{utt}__decoder_logprobs_l2r_{mode}"]
            r2l = arrays[f"{utt}__decoder_logprobs_r2l_{mode}"]
            for i, tokens in enumerate(decoding[utt][mode]["ctc_prefix_beam_search"]["nbest"]):
                n = len(tokens)
                self.rows[(case, *tokens)] = (l2r[i, : n + 1], r2l[i, : n + 1])
        self.frames = [decoding[utt][mode]["num_encoder_frames"] for utt, mode in cases]
        self.calls: list[tuple[int, ...]] = []

    def __call__(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        ys_in_pad: torch.Tensor,
        ys_in_lens: torch.Tensor,
        r_ys_in_pad: torch.Tensor,
        reverse_weight: float,
        *,
        memory_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(tuple(ys_in_pad.shape))
        gen = torch.Generator().manual_seed(0)
        l2r = -torch.rand(ys_in_pad.shape[0], ys_in_pad.shape[1], 60, generator=gen) * 100
        r2l = l2r.clone()
        for i in range(ys_in_pad.shape[0]):
            n = int(ys_in_lens[i])
            tokens = tuple(ys_in_pad[i, 1:n].tolist())
            assert tuple(r_ys_in_pad[i, 1:n].tolist()) == tokens[::-1]
            assert (ys_in_pad[i, n:] == EOS).all() and (r_ys_in_pad[i, n:] == EOS).all()
            stream = int(memory_rows[i])
            case = int(memory[stream, 0, 0])
            assert int(memory_mask[stream, 0].sum()) == self.frames[case]
            stored_l2r, stored_r2l = self.rows[(case, *tokens)]
            l2r[i, :n] = torch.from_numpy(stored_l2r)
            r2l[i, :n] = torch.from_numpy(stored_r2l)
        return l2r, r2l


@needs_fixture
def test_rescoring_on_stored_decoder_outputs_matches_wenet(decoding: dict[str, Any]) -> None:
    decoder = StoredDecoder(decoding, CASES)
    encoders = [torch.full((decoder.frames[k], 128), float(k)) for k in range(len(CASES))]
    results = attention_rescore(decoder, encoders, [nbest_of(decoding, u, m) for u, m in CASES], sos=SOS, eos=EOS)
    nbests = [nbest_of(decoding, u, m) for u, m in CASES]
    # streams of similar length share a decoder call; every hypothesis is scored exactly once
    assert len(decoder.calls) == len(length_groups(nbests))
    assert sum(rows for rows, _ in decoder.calls) == sum(len(n) for n in nbests)
    for (utt, mode), result in zip(CASES, results, strict=True):
        expected = decoding[utt][mode]
        winner = expected["attention_rescoring"]
        assert list(result.tokens) == winner["tokens"]
        assert result.best.nbest_index == winner["best_index_in_nbest"]
        assert score_ok(result.score, winner["score"])
        assert result.confidence == pytest.approx(winner["confidence"], rel=1e-3)
        assert list(result.times) == expected["ctc_prefix_beam_search"]["nbest_times"][winner["best_index_in_nbest"]]
        by_index = {h.nbest_index: h for h in result.hypotheses}
        for i, ref in enumerate(expected["per_hypothesis"]):
            got = by_index[i]
            assert list(got.tokens) == ref["tokens"]
            assert score_ok(got.ctc_score, ref["ctc_prefix_score"])
            assert score_ok(got.l2r_score, ref["l2r_decoder_score"])
            assert score_ok(got.r2l_score, ref["r2l_decoder_score"])
            assert score_ok(got.decoder_score, ref["decoder_score_combined"])
            assert score_ok(got.score, ref["final_score"])
        finals = [h.score for h in result.hypotheses]
        assert finals == sorted(finals, reverse=True)


@needs_fixture
def test_decoder_inputs_match_wenet(decoding: dict[str, Any]) -> None:
    utt, mode = "utt2", "full"
    nbest = nbest_of(decoding, utt, mode)
    batch = build_decoder_batch([torch.zeros(5, 4)], [nbest], SOS, EOS)
    expected = decoding[utt][mode]["decoder_inputs"]
    assert batch.ys_in_pad.tolist() == expected["l2r_with_sos_eos_padding"]
    assert batch.r_ys_in_pad.tolist() == expected["r2l_with_sos_eos_padding"]
    assert batch.ys_in_lens.tolist() == [len(h.tokens) + 1 for h in nbest]


class ToyDecoder(torch.nn.Module):
    """A small decoder whose output depends on the tokens and on the masked encoder memory."""

    def __init__(self, vocab: int = 12, dim: int = 8) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.embed = torch.nn.Parameter(torch.randn(vocab, dim, generator=gen))
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=gen))

    def forward(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        ys_in_pad: torch.Tensor,
        ys_in_lens: torch.Tensor,
        r_ys_in_pad: torch.Tensor,
        reverse_weight: float,
        *,
        memory_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weights = memory_mask.transpose(1, 2).float()  # (S, T, 1)
        context = ((memory * weights).sum(1) / weights.sum(1))[memory_rows]  # (M, D)

        def run(ys: torch.Tensor) -> torch.Tensor:
            prefix = self.embed[ys].cumsum(1)  # (M, L + 1, D): causal summary of the prefix
            return ((prefix + context[:, None, :]) @ self.out).log_softmax(-1)

        return run(ys_in_pad), run(r_ys_in_pad)


def test_batched_streams_equal_each_stream_alone() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    decoder = ToyDecoder()
    encoders = [torch.randn(t, 8, generator=gen) for t in (7, 19, 3)]
    nbests = [
        [Hypothesis((1, 2, 3), -1.5), Hypothesis((1, 2), -1.7), Hypothesis((), -9.0)],
        [Hypothesis((4, 4, 5, 6, 7, 8, 9), -3.0)],
        [Hypothesis((10,), -0.2), Hypothesis((2, 10), -0.4)],
    ]
    together = attention_rescore(decoder, encoders, nbests, sos=11, eos=11)
    for enc, nbest, joint in zip(encoders, nbests, together, strict=True):
        (alone,) = attention_rescore(decoder, [enc], [nbest], sos=11, eos=11)
        assert alone.tokens == joint.tokens
        assert [h.nbest_index for h in alone.hypotheses] == [h.nbest_index for h in joint.hypotheses]
        for a, b in zip(alone.hypotheses, joint.hypotheses, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)
            assert a.l2r_score == pytest.approx(b.l2r_score, abs=1e-4)
            assert a.r2l_score == pytest.approx(b.r2l_score, abs=1e-4)


def test_length_groups_keep_short_utterances_apart_from_long_ones() -> None:
    def nbest(length: int, count: int = 3) -> list[Hypothesis]:
        return [Hypothesis(tuple(range(2, 2 + length + i % 2)), -float(i)) for i in range(count)]

    nbests = [nbest(3), nbest(40), nbest(4), nbest(38), nbest(2), nbest(41)]
    groups = length_groups(nbests)
    assert sorted(s for g in groups for s in g) == list(range(len(nbests)))
    assert [sorted(g) for g in groups] == [[0, 2, 4], [1, 3, 5]]
    assert length_groups([nbest(10)] * 5) == [[0, 1, 2, 3, 4]]  # equal lengths: one call
    # a call holds at most max_positions padded positions (3 hypotheses x 12 per stream here) ...
    assert length_groups([nbest(10)] * 5, max_positions=72) == [[0, 1], [2, 3], [4]]
    # ... except a stream bigger than that, which gets a call of its own
    assert length_groups([nbest(10)] * 2, max_positions=10) == [[0], [1]]


@pytest.mark.parametrize(
    "rows",
    [[0, 0, 1, 2, 2, 2], [2, 0, 2, 1, 0, 2], [2, 2, 0], [1]],
    ids=["grouped", "interleaved", "a_memory_row_unused", "one_row"],
)
@pytest.mark.parametrize("training", [False, True], ids=["packed", "gathered"])
def test_shared_memory_source_attention_equals_per_row_memory(rows: list[int], training: bool) -> None:
    """In eval mode query rows are packed over the memory rows they share (``RowPacking``),
    in training gathered; both equal attending a copy of each row's memory."""
    torch.manual_seed(0)
    attention = MultiHeadedAttention(4, 16, 0.0).train(training)
    memory = torch.randn(3, 9, 16)
    mask = torch.arange(9)[None, None, :] < torch.tensor([9, 5, 7])[:, None, None]  # (3, 1, 9)
    index = torch.tensor(rows)
    query = torch.randn(len(rows), 4, 16)
    with torch.no_grad():
        shared = attention.forward_shared_memory(query, memory, mask, index)
        copied = attention(query, memory[index], memory[index], mask[index])
        packing = RowPacking.of(index, 3)
        packed = attention.attend_memory(query, *attention.memory_keys_values(memory), mask, packing)
    torch.testing.assert_close(shared, copied, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed, copied, rtol=1e-5, atol=1e-6)
    assert torch.equal(packing.memory_row_of_each(), index)
    assert packing.width == max(rows.count(r) for r in set(rows))


def test_reverse_weight_zero_uses_left_to_right_only() -> None:
    decoder = ToyDecoder()
    nbest = [Hypothesis((1, 2), -1.0), Hypothesis((3,), -2.0)]
    (result,) = attention_rescore(decoder, [torch.ones(4, 8)], [nbest], sos=11, eos=11, reverse_weight=0.0)
    for h in result.hypotheses:
        assert h.decoder_score == h.l2r_score
        assert h.score == pytest.approx(h.l2r_score + 0.5 * h.ctc_score)


def test_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="empty n-best"):
        attention_rescore(ToyDecoder(), [torch.ones(2, 8)], [[]], sos=11, eos=11)
    with pytest.raises(ValueError, match="2 encoder outputs but 1"):
        attention_rescore(ToyDecoder(), [torch.ones(2, 8)] * 2, [[Hypothesis((1,), 0.0)]], sos=11, eos=11)
    assert attention_rescore(ToyDecoder(), [], [], sos=11, eos=11) == []


@needs_fixture
@pytest.mark.parametrize("prefix_tree", [True, False], ids=["prefix-tree", "padded"])
def test_real_decoder_on_stored_encoder_outputs_matches_wenet(decoding: dict[str, Any], prefix_tree: bool) -> None:
    """The fixture model's decoder, all four (utterance, mode) streams in one batch, then each alone;
    decoding each n-best as a prefix tree and as padded hypotheses."""
    loader = pytest.importorskip("asr_core.model.loader")
    torch.set_num_threads(1)
    loaded = loader.load_wenet_model(FIXTURE / "model")
    arrays = np.load(FIXTURE / "expected.npz")
    encoders = [torch.from_numpy(arrays[f"{utt}__encoder_out_{mode}"]) for utt, mode in CASES]
    nbests = [nbest_of(decoding, utt, mode) for utt, mode in CASES]
    together = attention_rescore(
        loaded.model.decoder, encoders, nbests, sos=loaded.sos_id, eos=loaded.eos_id, ctc_weight=0.5,
        reverse_weight=0.3, prefix_tree=prefix_tree,
    )  # fmt: skip
    for (utt, mode), enc, nbest, joint in zip(CASES, encoders, nbests, together, strict=True):
        expected = decoding[utt][mode]
        assert list(joint.tokens) == expected["attention_rescoring"]["tokens"]
        assert score_ok(joint.score, expected["attention_rescoring"]["score"])
        by_index = {h.nbest_index: h for h in joint.hypotheses}
        for i, ref in enumerate(expected["per_hypothesis"]):
            assert score_ok(by_index[i].l2r_score, ref["l2r_decoder_score"])
            assert score_ok(by_index[i].r2l_score, ref["r2l_decoder_score"])
            assert score_ok(by_index[i].score, ref["final_score"])
        (alone,) = attention_rescore(
            loaded.model.decoder, [enc], [nbest], sos=loaded.sos_id, eos=loaded.eos_id, prefix_tree=prefix_tree
        )
        assert alone.tokens == joint.tokens
        for a, b in zip(alone.hypotheses, joint.hypotheses, strict=True):
            assert a.nbest_index == b.nbest_index
            assert score_ok(a.score, b.score)


def test_prefix_tree_shares_prefixes_and_masks_ancestors() -> None:
    tree = PrefixTree.of([[5, 6, 7], [5, 6, 8], [5], []], sos=1)
    assert tree.tokens == [1, 5, 6, 7, 8] and tree.depths == [0, 1, 2, 3, 3] and tree.parents == [-1, 0, 1, 2, 2]
    assert tree.paths == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1], [0]]
    mask = tree.mask(6)  # one padding node
    assert mask[4].tolist() == [True, True, True, False, True, False]  # 8 sees sos, 5, 6 and itself, not 7
    assert mask[3].tolist() == [True, True, True, True, False, False]
    assert mask[5].tolist() == [False] * 5 + [True]  # padding sees only itself


@needs_fixture
def test_int8_rescoring_decoder_fuses_each_relu_into_its_linear_with_the_same_outputs() -> None:
    """The int8 rescoring decoder runs each feed-forward's first Linear and its ReLU as one int8
    op; its prefix-tree log-probs are those of the same int8 Linears with separate ReLUs."""
    import copy

    from torch import nn
    from torch.ao.nn.intrinsic.quantized.dynamic import LinearReLU

    loader = pytest.importorskip("asr_core.model.loader")
    from asr_core.backends import rescoring_decoder
    from asr_core.backends.quantize import quantize_linears

    torch.set_num_threads(1)
    loaded = loader.load_wenet_model(FIXTURE / "model")
    fused = rescoring_decoder("torch-int8", loaded.model.decoder)
    separate = quantize_linears(copy.deepcopy(loaded.model.decoder), {nn.Linear})
    layers = len(loaded.model.decoder.left_decoder.decoders) + len(loaded.model.decoder.right_decoder.decoders)
    assert sum(isinstance(m, LinearReLU) for m in fused.modules()) == layers
    trees = [PrefixTree.of([[5, 6, 7], [5, 6, 8], [9]], loaded.sos_id), PrefixTree.of([[4, 4]], loaded.sos_id)]
    batch = tree_batch(trees, loaded.eos_id)
    memory = torch.randn(2, 20, loaded.d_model, generator=torch.Generator().manual_seed(5))
    memory_mask = torch.ones(2, 1, 20, dtype=torch.bool)
    memory_mask[1, 0, 12:] = False
    with torch.inference_mode():
        ours = fused.forward_tree(memory, memory_mask, batch, batch)
        theirs = separate.forward_tree(memory, memory_mask, batch, batch)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


@needs_fixture
@pytest.mark.parametrize("backend", ["torch", "torch-int8"])
def test_prefix_tree_decoding_equals_padded_decoding(backend: str) -> None:
    """The float and the int8 rescoring decoders on random n-best lists of shared prefixes.

    The int8 decoder quantizes its activations with one scale per call, so differently shaped
    calls differ a little (as the padded path does between batch compositions): there the
    scores agree within 0.5 % and the winners are the same."""
    loader = pytest.importorskip("asr_core.model.loader")
    from asr_core.backends import rescoring_decoder

    torch.set_num_threads(1)
    loaded = loader.load_wenet_model(FIXTURE / "model")
    decoder = rescoring_decoder(backend, loaded.model.decoder)
    gen = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(3)
    encoders, nbests = [], []
    for frames in (12, 30, 55):
        encoders.append(torch.randn(frames, loaded.d_model, generator=gen))
        base = rng.integers(2, loaded.vocab_size - 1, size=frames // 3).tolist()
        nbest = []
        for rank in range(6):
            tokens = list(base)
            if rank:
                tokens[int(rng.integers(len(tokens)))] = int(rng.integers(2, loaded.vocab_size - 1))
            nbest.append(Hypothesis(tuple(tokens[: len(tokens) - rank % 2]), -float(rank)))
        nbests.append(nbest)
    kwargs = {"sos": loaded.sos_id, "eos": loaded.eos_id}
    tree = attention_rescore(decoder, encoders, nbests, **kwargs)
    padded = attention_rescore(decoder, encoders, nbests, prefix_tree=False, **kwargs)
    tolerance = {"abs": 1e-4} if backend == "torch" else {"rel": 5e-3}
    for a, b in zip(tree, padded, strict=True):
        assert a.tokens == b.tokens
        for x, y in zip(a.hypotheses, b.hypotheses, strict=True):
            assert x.nbest_index == y.nbest_index
            assert x.l2r_score == pytest.approx(y.l2r_score, **tolerance)
            assert x.r2l_score == pytest.approx(y.r2l_score, **tolerance)
