"""The inference fast paths of asr_core.model equal the straightforward (WeNet-shaped) code:
channels-last conv module, fused q/k|v projection, skipped cache zeroing, host-side max offset,
channels-last subsampling, bf16 subsampling convs with fused ReLUs; and the ``torch-int8`` runner
stays close to float."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from asr_core.backends import Bf16Convs, ChunkStepInputs, make_runner, native_bf16_cpu
from asr_core.model import LoadedModel, attention, load_wenet_model
from asr_core.model.attention import MultiHeadedAttention, RelPositionMultiHeadedAttention, dot_products
from asr_core.model.convolution import ConvolutionModule, pointwise_as_linear
from asr_core.model.decoder import log_softmax_over_logits
from asr_core.model.feed_forward import PositionwiseFeedForward
from asr_core.model.inference import serving_trace
from asr_core.model.subsampling import Conv2dSubsampling

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "expected.npz").is_file(), reason=f"WeNet fixture not found at {FIXTURE}"
)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def wenet_conv_module(module: ConvolutionModule, x: Tensor, mask_pad: Tensor | None, cache: Tensor | None) -> Tensor:
    """WeNet's ConvolutionModule.forward (channels first, Conv1d calls); returns y (B, T, D)."""
    x = x.transpose(1, 2)  # (B, D, T)
    if mask_pad is not None:
        x = x.masked_fill(~mask_pad, 0.0)
    if module.lorder > 0:
        x = nn.functional.pad(x, (module.lorder, 0)) if cache is None else torch.cat((cache, x), dim=2)
    x = nn.functional.glu(module.pointwise_conv1(x), dim=1)
    x = module.depthwise_conv(x)
    if module.use_layer_norm:
        x = module.norm(x.transpose(1, 2)).transpose(1, 2)
    else:
        x = module.norm(x)
    x = module.pointwise_conv2(module.activation(x))
    if mask_pad is not None:
        x = x.masked_fill(~mask_pad, 0.0)
    return x.transpose(1, 2)


@pytest.mark.parametrize(
    ("norm", "causal", "with_cache", "with_mask"),
    [
        ("layer_norm", True, True, False),
        ("layer_norm", True, False, False),
        ("batch_norm", True, True, False),
        ("layer_norm", False, False, True),
        ("batch_norm", False, False, True),
    ],
)
def test_conv_module_matches_wenet(norm: str, causal: bool, with_cache: bool, with_mask: bool) -> None:
    torch.manual_seed(0)
    module = ConvolutionModule(16, 7 if not causal else 8, "swish", norm, causal).eval()
    if isinstance(module.norm, nn.BatchNorm1d):
        assert module.norm.running_mean is not None and module.norm.running_var is not None
        module.norm.running_mean.normal_()
        module.norm.running_var.uniform_(0.5, 2.0)
    x = torch.randn(3, 5, 16)
    cache = torch.randn(3, 16, module.lorder) if with_cache else None
    mask_pad = (torch.arange(5)[None, None, :] < torch.tensor([5, 3, 1])[:, None, None]) if with_mask else None
    with torch.inference_mode():
        y, new_cache = module(x, mask_pad, cache)
        want = wenet_conv_module(module, x, mask_pad, cache)
    assert float((y - want).abs().max()) <= 1e-5
    if causal:
        context = torch.cat((cache if cache is not None else torch.zeros(3, 16, module.lorder), x.transpose(1, 2)), 2)
        assert torch.equal(new_cache, context[:, :, -module.lorder :])
    else:
        assert new_cache.shape == (3, 16, 0)


def separate_projections(att: MultiHeadedAttention, x: Tensor) -> tuple[Tensor, Tensor]:
    """q (B, H, T, d_k) and keys|values (B, H, T, 2*d_k) from linear_q/k/v one by one."""
    b, t, _ = x.shape
    q = att.linear_q(x).view(b, t, att.h, att.d_k).transpose(1, 2)
    k = att.linear_k(x).view(b, t, att.h, att.d_k).transpose(1, 2)
    v = att.linear_v(x).view(b, t, att.h, att.d_k).transpose(1, 2)
    return q, torch.cat((k, v), dim=-1)


def reference_cached(att: MultiHeadedAttention, x: Tensor, kv_cache: Tensor, positions: Tensor) -> Tensor:
    q, kv_new = separate_projections(att, x)
    kv = torch.cat((kv_cache, kv_new), dim=2)
    k, v = kv[..., : att.d_k], kv[..., att.d_k :]
    return att.attend(q, k, v, att.scores(q, k, positions, 0), None)


def test_conv_module_zero_frame_glu_is_cached_until_its_weights_change() -> None:
    module = ConvolutionModule(16, 5, "swish", "layer_norm", causal=True).eval()
    x = torch.randn(2, 3, 16)
    with torch.inference_mode():
        first = module._zero_frame_glu(x)
        assert module._zero_frame_glu(x) is first
    torch.testing.assert_close(first.view(-1), nn.functional.glu(module.pointwise_conv1.bias.detach(), dim=0))
    with torch.no_grad():
        module.pointwise_conv1.bias.add_(1.0)
    with torch.inference_mode():
        edited = module._zero_frame_glu(x)
    torch.testing.assert_close(edited.view(-1), nn.functional.glu(module.pointwise_conv1.bias.detach(), dim=0))
    module.pointwise_conv1 = pointwise_as_linear(module.pointwise_conv1)
    with torch.inference_mode():
        assert module._zero_frame_glu(x) is not edited


@pytest.mark.parametrize("cls", [MultiHeadedAttention, RelPositionMultiHeadedAttention])
def test_fused_qkv_equals_separate_projections_and_follows_weight_edits(cls: type[MultiHeadedAttention]) -> None:
    torch.manual_seed(1)
    att = cls(4, 32, 0.0, key_bias=False).eval()
    x = torch.randn(2, 3, 32)
    kv_cache = torch.randn(2, 4, 5, 16)
    positions = torch.arange(8)[None].expand(2, -1) + 100
    with torch.inference_mode():
        y, kv_new = att.forward_cached(x, kv_cache, None, positions, 0)
        assert float((kv_new - separate_projections(att, x)[1]).abs().max()) <= 1e-6
        assert float((y - reference_cached(att, x, kv_cache, positions)).abs().max()) <= 1e-5
    with torch.no_grad():
        att.linear_k.weight.mul_(1.5)  # in place: the cached fused weight must follow
    with torch.inference_mode():
        y_edit, kv_edit = att.forward_cached(x, kv_cache, None, positions, 0)
        assert float((kv_edit - kv_new).abs().max()) > 1e-3
        assert float((kv_edit - separate_projections(att, x)[1]).abs().max()) <= 1e-6
        assert float((y_edit - reference_cached(att, x, kv_cache, positions)).abs().max()) <= 1e-5


def test_fused_qkv_trains() -> None:
    torch.manual_seed(2)
    att = RelPositionMultiHeadedAttention(4, 32, 0.0).train()
    y, kv_new = att.forward_cached(torch.randn(2, 3, 32), torch.zeros(2, 4, 0, 16), None, torch.arange(3)[None], 0)
    (y.square().sum() + kv_new.sum()).backward()
    for linear in (att.linear_q, att.linear_k, att.linear_v):
        assert linear.weight.grad is not None and float(linear.weight.grad.abs().sum()) > 0


def test_fused_attention_in_eval_mode_equals_the_explicit_path() -> None:
    """Eval mode runs plain attention through torch's fused kernel: same output as the explicit
    masked softmax (training mode), including WeNet's zeros for a query with every key masked."""
    torch.manual_seed(3)
    att = MultiHeadedAttention(4, 32, 0.0)
    query, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = torch.rand(3, 5, 7) > 0.4
    mask[0, 2] = False  # a query row with no key to attend to
    source_mask = torch.ones(2, 1, 7, dtype=torch.bool)
    source_mask[1, 0, 4:] = False
    rows = torch.tensor([0, 1, 1])
    outputs = {}
    for training in (True, False):
        att.train(training)
        with torch.no_grad():
            outputs[training] = (
                att(query, memory, memory, mask),
                att(query, memory, memory, None),
                att.forward_shared_memory(query, memory[:2], source_mask, rows),
            )
    for explicit, fused in zip(outputs[True], outputs[False], strict=True):
        assert float((explicit - fused).abs().max()) <= 1e-5
    assert torch.equal(outputs[False][0][0, 2], att.linear_out.bias)  # zeros through linear_out


def test_kernel_mask_is_an_additive_bias_only_where_every_query_keeps_a_key() -> None:
    """A mask prepared once for a decoder's layers: as an additive bias it gives the bool mask's
    outputs (fused and explicit path, source attention over shared memory too); a mask with an
    all-masked query, or a module not running the fused kernel, keeps the bool mask."""
    torch.manual_seed(4)
    att = MultiHeadedAttention(4, 32, 0.0).eval()
    query, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = (torch.rand(3, 5, 7) > 0.4) | torch.eye(5, 7, dtype=torch.bool)
    source_mask = torch.ones(2, 1, 7, dtype=torch.bool)
    source_mask[1, 0, 4:] = False
    rows = torch.tensor([0, 1, 1])
    bias, source_bias = att.kernel_mask(mask, torch.float32), att.kernel_mask(source_mask, torch.float32)
    assert bias.dtype == torch.float32 and set(bias.unique().tolist()) == {0.0, -math.inf}
    with torch.no_grad():
        assert torch.equal(att(query, memory, memory, bias), att(query, memory, memory, mask))
        shared = att.forward_shared_memory(query, memory[:2], source_bias, rows)
        assert torch.equal(shared, att.forward_shared_memory(query, memory[:2], source_mask, rows))
        q, k, v = att._heads(query, att.linear_q), att._heads(memory, att.linear_k), att._heads(memory, att.linear_v)
        by_bias = att.attend(q, k, v, att.scores(q, k, None, 0), bias)
        by_bool = att.attend(q, k, v, att.scores(q, k, None, 0), mask)
        assert float((by_bias - by_bool).abs().max()) <= 1e-6
    mask[0, 2] = False  # a query with nothing to attend: WeNet's zeros need the bool mask
    assert att.kernel_mask(mask, torch.float32) is mask
    att.train()
    assert att.kernel_mask(source_mask, torch.float32) is source_mask


@pytest.mark.parametrize("keys_first", [False, True])
def test_chunk_query_dot_products_equal_the_plain_product(monkeypatch: pytest.MonkeyPatch, keys_first: bool) -> None:
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 9, 16)
    monkeypatch.setitem(attention._keys_first, (3, 9, 16, torch.float32), keys_first)
    assert torch.allclose(dot_products(q, k), q @ k.transpose(-2, -1), atol=1e-5)
    assert torch.allclose(dot_products(k, q), k @ q.transpose(-2, -1), atol=1e-5)


def test_the_product_order_is_timed_once_per_shape_and_not_while_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "_keys_first", {})
    timed: list[tuple[object, ...]] = []
    real = attention._time_keys_first

    def timing(*shape: object) -> bool:
        timed.append(shape)
        return real(*shape)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "_time_keys_first", timing)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 11, 8)
    with serving_trace():  # a graph for this process (backends.traced): the fast paths stay on
        traced = torch.jit.trace(dot_products, (q, k), check_trace=False)
    assert timed == [] and attention._keys_first == {}  # an untimed shape traces the plain order
    assert torch.allclose(traced(q, k), q @ k.transpose(-2, -1), atol=1e-5)
    first = dot_products(q, k)
    dot_products(torch.randn(7, 4, 5, 8), torch.randn(7, 4, 11, 8))  # another batch, same shape
    assert timed == [(5, 11, 8, torch.float32)]
    assert isinstance(attention._keys_first[(5, 11, 8, torch.float32)], bool)
    assert torch.allclose(first, q @ k.transpose(-2, -1), atol=1e-5)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_wenet_model(FIXTURE / "model")


def chunk_inputs(loaded: LoadedModel, invalid: float) -> tuple[Tensor, ...]:
    """Three streams, a 12-frame ring each, partly valid; invalid frames hold ``invalid``."""
    g = torch.Generator().manual_seed(4)
    batch, width = 3, 12
    offsets = torch.tensor([0, 9, 700])
    pos = offsets[:, None] - width + torch.randperm(width, generator=g)[None]
    mask = (pos >= 0) & (torch.rand(batch, width, generator=g) > 0.2)
    att = torch.randn(loaded.num_blocks, batch, loaded.heads, width, 2 * loaded.d_k, generator=g)
    att = att.masked_fill(~mask[None, :, None, :, None], invalid)
    return (
        10 + 3 * torch.randn(batch, 19, 80, generator=g),
        offsets,
        att,
        pos,
        mask,
        torch.randn(loaded.num_blocks, batch, loaded.d_model, loaded.cnn_cache_frames, generator=g),
    )


@needs_fixture
def test_skipped_cache_zeroing_and_host_max_offset_change_nothing(loaded: LoadedModel) -> None:
    encoder = loaded.model.encoder
    with torch.inference_mode():
        want = encoder.forward_chunk_batch(*chunk_inputs(loaded, float("nan")))
        finite = chunk_inputs(loaded, 123.0)
        for got in (
            encoder.forward_chunk_batch(*finite, cache_is_finite=True),
            encoder.forward_chunk_batch(*finite, cache_is_finite=True, max_offset=700),
            encoder.forward_chunk_batch(*finite, cache_is_finite=True, max_offset=5000),
        ):
            for g, w in zip(got, want, strict=True):
                assert torch.isfinite(g).all()
                assert torch.equal(g, w)


@needs_fixture
def test_replaced_projections_equal_the_fused_float_path(loaded: LoadedModel) -> None:
    """What torch-int8 installs before quantizing (Linears for the pointwise convs, one fused
    q/k|v Linear per attention) computes the same as the default path in float."""
    inputs = chunk_inputs(loaded, 0.0)
    encoder = loaded.model.encoder
    replaced = copy.deepcopy(encoder)
    for module in replaced.modules():
        if isinstance(module, ConvolutionModule):
            module.pointwise_conv1 = pointwise_as_linear(module.pointwise_conv1)
            module.pointwise_conv2 = pointwise_as_linear(module.pointwise_conv2)
        if isinstance(module, MultiHeadedAttention):
            module.qkv_projection = module.fused_qkv_linear()
    with torch.inference_mode():
        want = encoder.forward_chunk_batch(*inputs)
        got = replaced.forward_chunk_batch(*inputs)
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 1e-5


@needs_fixture
def test_subsampling_runs_channels_last(loaded: LoadedModel) -> None:
    convs = [m for m in loaded.model.encoder.embed.conv if isinstance(m, nn.Conv2d)]
    assert convs and all(c.weight.stride()[1] == 1 for c in convs)


@pytest.mark.parametrize("rate", [4, 6, 8])
def test_subsampling_features_in_channels_last_order_change_nothing(rate: int) -> None:
    torch.manual_seed(rate)
    wenet_order = Conv2dSubsampling(80, 64, rate).eval()
    reordered = copy.deepcopy(wenet_order)
    reordered.channels_last_features()
    x = torch.randn(3, 40, 80)
    with torch.inference_mode():
        torch.testing.assert_close(reordered(x), wenet_order(x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not native_bf16_cpu(),
    reason="Bf16Convs run only where oneDNN computes bf16 natively (AVX512-BF16 or AMX, not capped below)",
)
@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
@pytest.mark.parametrize("rate", [4, 6, 8])
def test_bf16_convs_fuse_the_relus_bit_for_bit_eagerly_and_traced(rate: int) -> None:
    torch.manual_seed(rate)
    convs = Conv2dSubsampling(80, 64, rate).conv
    plain = copy.deepcopy(convs).to(torch.bfloat16)
    fused = Bf16Convs(convs).eval()
    x = torch.randn(3, 1, 40, 80)
    with torch.inference_mode():
        want = plain(x.to(torch.bfloat16)).float()
        traced = torch.jit.freeze(torch.jit.trace(fused, (x,)))
        assert torch.equal(fused(x), want)
        assert torch.equal(traced(x), want)


@needs_fixture
@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_torch_int8_runner_stays_close_to_float(loaded: LoadedModel) -> None:
    inputs = chunk_inputs(loaded, 0.0)
    float_step = make_runner("torch", loaded).step(ChunkStepInputs(*inputs))
    int8_step = make_runner("torch-int8", loaded).step(ChunkStepInputs(*inputs))
    assert all(type(m) is not nn.Linear or m.weight.dtype == torch.float32 for m in loaded.model.modules())
    for got, want in zip(int8_step, float_step, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
    # Measured on this fixture: max |diff| of log-probs ~0.6, greedy tokens agree on ~98% of frames.
    assert float((int8_step.log_probs - float_step.log_probs).abs().max()) < 2.0
    agree = (int8_step.log_probs.argmax(-1) == float_step.log_probs.argmax(-1)).float().mean()
    assert float(agree) >= 0.8
    assert np.isfinite(int8_step.ys.numpy()).all()


@needs_fixture
def test_glu_cache_layout_gives_wenets_outputs_chunk_after_chunk(loaded: LoadedModel) -> None:
    """Three streams at different offsets (one starting, one 9 frames in: part of its conv
    history is before its start) run five chunks with the conv cache in WeNet's layout and in
    the GLU layout (the GLU of the same history; whatever before the start), each carrying its
    own caches forward: the outputs and attention caches agree, and the GLU cache holds what the
    GLU computes from WeNet's cached inputs."""
    encoder = loaded.model.encoder
    g = torch.Generator().manual_seed(11)
    batch, width, chunk = 3, 16, 4
    offsets = torch.tensor([0, 9, 700])
    pos = offsets[:, None] - width + torch.arange(width)[None]
    mask = pos >= 0
    att = (
        torch.randn(loaded.num_blocks, batch, loaded.heads, width, 2 * loaded.d_k, generator=g)
        * mask[None, :, None, :, None]
    )
    k = loaded.cnn_cache_frames
    before_start = (offsets[:, None] - k + torch.arange(k)[None]) < 0  # (B, K-1)
    inputs = torch.randn(loaded.num_blocks, batch, loaded.d_model, k, generator=g)
    inputs = inputs.masked_fill(before_start[None, :, None, :], 0.0)  # WeNet: zeros before the start
    with torch.inference_mode():
        glus = torch.stack(
            [
                nn.functional.glu(layer.conv_module.pointwise_conv1(inputs[i]), dim=1)
                for i, layer in enumerate(encoder.encoders)
            ]
        )
    glus = glus.masked_fill(before_start[None, :, None, :], 42.0)  # the GLU layout ignores these frames
    caches = {False: (att, pos, mask, inputs), True: (att, pos, mask, glus)}
    with torch.inference_mode():
        for step in range(5):
            xs = 10 + 3 * torch.randn(batch, 19, 80, generator=g)
            offs = offsets + step * chunk
            out = {}
            for glu in (False, True):
                a, p, m, c = caches[glu]
                ys, kv, cnn = encoder.forward_chunk_batch(xs, offs, a, p, m, c, cache_is_finite=True, glu_cache=glu)
                out[glu] = (ys, kv, cnn)
                ring = (offs[:, None] + torch.arange(chunk)[None]) % width  # (B, C)
                a, p, m = a.clone(), p.clone(), m.clone()
                rows = torch.arange(batch)[:, None]
                a[:, rows, :, ring] = kv.permute(1, 3, 0, 2, 4)
                p[rows, ring] = offs[:, None] + torch.arange(chunk)[None]
                m[rows, ring] = True
                caches[glu] = (a, p, m, cnn)
            torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-4, atol=1e-4)
        # After the last chunk, the GLU cache is the GLU of WeNet's cached conv inputs.
        conv = encoder.encoders[0].conv_module
        wenet_inputs = out[False][2][0].transpose(1, 2)  # (B, K-1, D)
        glu_of_inputs = nn.functional.glu(conv.pointwise_conv1(wenet_inputs.transpose(1, 2)), dim=1)
        torch.testing.assert_close(out[True][2][0], glu_of_inputs, rtol=1e-4, atol=1e-4)


def test_log_softmax_over_logits_is_exact_and_in_place_only_outside_autograd() -> None:
    logits = 3.0 * torch.randn(37, 4233, generator=torch.Generator().manual_seed(6))
    expected = torch.log_softmax(logits, dim=-1)
    with torch.inference_mode():
        given = logits.clone()
        out = log_softmax_over_logits(given)
        assert torch.equal(out, expected) and out.data_ptr() == given.data_ptr()
    trained = logits.clone().requires_grad_(True)
    out = log_softmax_over_logits(trained)
    assert torch.equal(out.detach(), expected) and out.data_ptr() != trained.data_ptr()
    out.sum().backward()
    assert trained.grad is not None


@pytest.mark.parametrize("activation", ["relu", "swish", "gelu"])
def test_feed_forward_activation_in_place_in_inference_gives_the_same_values(activation: str) -> None:
    """Outside autograd the ReLU / SiLU overwrite the first Linear's output; with autograd, in
    training mode (dropout) and for activations without an in-place form nothing changes."""
    torch.manual_seed(7)
    block = PositionwiseFeedForward(16, 64, 0.0, activation).eval()
    x = torch.randn(3, 5, 16)
    expected = block.w_2(block.activation(block.w_1(x))).detach()
    with torch.inference_mode():
        assert torch.equal(block(x), expected)
    trained = block(x)
    assert trained.requires_grad and torch.equal(trained.detach(), expected)
    trained.sum().backward()
    assert block.w_1.weight.grad is not None
