"""Fidelity of asr_core.model against WeNet's own outputs (../shared/fixtures/wenet_u2pp_small)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asr_core.model import LoadedModel, load_wenet_model
from asr_core.model.embedding import sinusoid
from asr_core.offline import encode_full, encode_streaming

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
pytestmark = pytest.mark.skipif(
    not (FIXTURE / "expected.npz").is_file(), reason=f"WeNet fixture not found at {FIXTURE}"
)
ENC_TOL = 1e-4
LOGP_TOL = 1e-3
UTTS = ["utt1", "utt2"]
SETTINGS = [(4, -1), (4, 2), (8, -1), (16, 4)]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_wenet_model(FIXTURE / "model")


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "expected.npz") as npz:
        return dict(npz)


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return json.loads((FIXTURE / "manifest.json").read_text())


@pytest.fixture(scope="module")
def decoding() -> dict[str, Any]:
    return json.loads((FIXTURE / "decoding.json").read_text())


def fbank(expected: dict[str, np.ndarray], utt: str) -> torch.Tensor:
    return torch.from_numpy(expected[f"{utt}__fbank"])


def assert_close(actual: torch.Tensor, want: np.ndarray, tol: float, what: str) -> None:
    assert tuple(actual.shape) == want.shape, f"{what}: shape {tuple(actual.shape)} != {want.shape}"
    diff = float((actual.detach().float() - torch.from_numpy(want)).abs().max()) if want.size else 0.0
    assert diff <= tol, f"{what}: max abs diff {diff} > {tol}"


def test_intermediate_encoder_tensors(loaded: LoadedModel, expected: dict[str, np.ndarray]) -> None:
    encoder = loaded.model.encoder
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            captured[name] = output[0] if isinstance(output, tuple) else output

        return hook

    assert encoder.global_cmvn is not None
    handles = [encoder.global_cmvn.register_forward_hook(keep("encoder_cmvn_out"))]
    handles.append(encoder.pos_enc.register_forward_hook(keep("encoder_embed_out")))
    for i, layer in enumerate(encoder.encoders):
        handles.append(layer.register_forward_hook(keep(f"encoder_layer{i}_out")))
    try:
        enc = encode_full(loaded, fbank(expected, "utt1"))
    finally:
        for handle in handles:
            handle.remove()
    assert_close(enc, expected["utt1__encoder_out_full"], ENC_TOL, "encoder_out_full")
    for name, value in captured.items():
        assert_close(value[0], expected[f"utt1__{name}"], ENC_TOL, name)
    assert len(captured) == 2 + loaded.num_blocks
    pos = sinusoid(torch.arange(enc.size(0)), loaded.d_model)
    assert_close(pos, expected["utt1__encoder_pos_emb"], ENC_TOL, "encoder_pos_emb")


@pytest.mark.parametrize("utt", UTTS)
def test_full_and_chunk_masked(loaded: LoadedModel, expected: dict[str, np.ndarray], utt: str) -> None:
    xs = fbank(expected, utt)
    assert_close(encode_full(loaded, xs), expected[f"{utt}__encoder_out_full"], ENC_TOL, "full")
    with torch.inference_mode():
        for chunk, left in SETTINGS:
            ys, masks = loaded.model.encoder(xs[None], torch.tensor([xs.size(0)]), chunk, left)
            assert bool(masks.all())
            name = f"encoder_out_chunkmask_c{chunk}_l{left}"
            assert_close(ys[0], expected[f"{utt}__{name}"], ENC_TOL, f"{utt} {name}")


@pytest.mark.parametrize("utt", UTTS)
def test_streaming_outputs_caches_and_shapes(
    loaded: LoadedModel, expected: dict[str, np.ndarray], manifest: dict[str, Any], utt: str
) -> None:
    xs = fbank(expected, utt)
    encoder = loaded.model.encoder
    for chunk, left in SETTINGS:
        tag = f"c{chunk}_l{left}"
        enc, infos = encode_streaming(loaded, xs, chunk, left)
        assert_close(enc, expected[f"{utt}__encoder_out_stream_{tag}"], ENC_TOL, f"{utt} stream {tag}")
        with torch.inference_mode():
            ys, _ = encoder.forward_chunk_by_chunk(xs[None], chunk, left)
        assert_close(ys[0], expected[f"{utt}__encoder_out_stream_{tag}"], ENC_TOL, "forward_chunk_by_chunk")
        table = manifest["streaming"]["per_utterance"][utt][tag]["chunks"]
        assert len(infos) == len(table)
        att_cache: torch.Tensor | None = None
        cnn_cache: torch.Tensor | None = None
        for info, row in zip(infos, table, strict=True):
            start, end = row["input_frames_[start,end)"]
            assert (info.fbank_start, info.fbank_end, info.offset) == (start, end, row["offset_in"])
            with torch.inference_mode():
                out, att_cache, cnn_cache = encoder.forward_chunk(
                    xs[None, start:end], info.offset, chunk * left, att_cache, cnn_cache
                )
            assert list(out.shape) == row["output_shape"]
            assert list(att_cache.shape) == row["att_cache_shape_after"], f"{utt} {tag} {info.index}"
            assert list(cnn_cache.shape) == row["cnn_cache_shape_after"]
            assert info.att_cache_frames == att_cache.size(2)
            for what, value in (("out", out[0]), ("att_cache", att_cache), ("cnn_cache", cnn_cache)):
                key = f"{utt}__stream_{tag}_chunk{info.index}_{what}"
                if key in expected:
                    assert_close(value, expected[key], ENC_TOL, key)
        assert f"{utt}__stream_{tag}_chunk2_out" in expected


@pytest.mark.parametrize("utt", UTTS)
def test_ctc_log_probs(loaded: LoadedModel, expected: dict[str, np.ndarray], utt: str) -> None:
    xs = fbank(expected, utt)
    with torch.inference_mode():
        full = loaded.model.ctc_log_probs(encode_full(loaded, xs)[None])[0]
        stream = loaded.model.ctc_log_probs(encode_streaming(loaded, xs, 4, 2)[0][None])[0]
    assert_close(full, expected[f"{utt}__ctc_logprobs_full"], LOGP_TOL, "ctc full")
    assert_close(stream, expected[f"{utt}__ctc_logprobs_stream_c4_l2"], LOGP_TOL, "ctc stream")


@pytest.mark.parametrize("utt", UTTS)
@pytest.mark.parametrize("mode", ["full", "stream_c8_l-1"])
def test_decoder_log_probs(
    loaded: LoadedModel, expected: dict[str, np.ndarray], decoding: dict[str, Any], utt: str, mode: str
) -> None:
    model = loaded.model
    xs = fbank(expected, utt)
    enc = encode_full(loaded, xs) if mode == "full" else encode_streaming(loaded, xs, 8, -1)[0]
    info = decoding[utt][mode]
    nbest: list[list[int]] = info["ctc_prefix_beam_search"]["nbest"]
    hyps_pad, hyps_lens = model.rescoring_inputs(nbest)
    assert hyps_pad.tolist() == info["decoder_inputs"]["l2r_with_sos_eos_padding"]
    reverse_weight = 0.3
    with torch.inference_mode():
        l2r, r2l = model.forward_attention_decoder(hyps_pad, hyps_lens, enc[None], reverse_weight)
    for i, hyp in enumerate(nbest):
        valid = len(hyp) + 1
        for name, logp in (("l2r", l2r), ("r2l", r2l)):
            key = f"{utt}__decoder_logprobs_{name}_{mode}"
            assert_close(logp[i, :valid], expected[key][i, :valid], LOGP_TOL, f"{key} row {i}")
    with torch.inference_mode():
        l2r_only, empty = model.forward_attention_decoder(hyps_pad, hyps_lens, enc[None], 0.0)
    assert empty.numel() == 0
    assert torch.equal(l2r_only, l2r)
