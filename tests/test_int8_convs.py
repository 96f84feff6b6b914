"""The int8 runner's subsampling convs (``quantize.Int8Convs``): close to float32, the same
traced as eager, and chosen only where the CPU has int8 dot products."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from asr_core import cpu_isa
from asr_core.backends import TorchChunkRunner, make_runner
from asr_core.backends.quantize import (
    INT8_CONVS_MIN_CHANNELS,
    Bf16Convs,
    Int8Convs,
    int8_convs_supported,
    native_bf16_cpu,
    subsampling_convs,
)
from asr_core.model.loader import load_wenet_model
from asr_core.model.subsampling import Conv2dSubsampling

DEMO_MODEL = Path(__file__).resolve().parents[1] / "asr_core" / "demo_model"

needs_int8_convs = pytest.mark.skipif(
    not int8_convs_supported(),
    reason="Int8Convs run only with oneDNN, torch._int_mm and a CPU with VNNI or AMX (not capped below)",
)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@needs_int8_convs
@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
@pytest.mark.parametrize("rate", [4, 6, 8])
def test_int8_convs_stay_close_to_float_and_trace_to_the_same_outputs(rate: int) -> None:
    torch.manual_seed(rate)
    convs = Conv2dSubsampling(80, 256, rate).conv.eval()
    int8 = Int8Convs(convs).eval()
    x = 10 + 3 * torch.randn(6, 1, 40, 80)  # fbank-like levels
    with torch.inference_mode():
        want = convs(x)
        got = int8(x)
        traced = torch.jit.freeze(torch.jit.trace(int8, (x,)))
        assert torch.equal(traced(x), got)
        # The next layer reads the output in the float stack's channels-last layout.
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == torch.float32
        # Measured: 1.3 / 1.4 / 1.6 % at rates 4 / 6 / 8 (bf16 alone: 0.4 %).
        assert relative_error(got, want) < 0.04
        assert bool((got >= 0).all())


@needs_int8_convs
def test_int8_convs_take_a_silent_batch_without_dividing_by_zero() -> None:
    torch.manual_seed(0)
    convs = Conv2dSubsampling(80, 64, 4).conv.eval()
    first = convs[0]
    assert isinstance(first, nn.Conv2d) and first.bias is not None
    with torch.no_grad():
        first.bias.fill_(-1e4)  # the first ReLU's output is all zeros: a zero activation scale
    x = torch.randn(2, 1, 19, 80)
    with torch.inference_mode():
        got = Int8Convs(convs).eval()(x)
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, convs(x), atol=0.02, rtol=0.0)


def test_int8_convs_refuse_a_stack_they_do_not_run() -> None:
    with pytest.raises(TypeError, match="Conv2d"):
        Int8Convs(nn.Sequential(nn.Conv2d(1, 8, 3, 2), nn.ReLU()))  # one conv: nothing to quantize
    with pytest.raises(TypeError, match="Conv2d"):
        Int8Convs(nn.Sequential(nn.Conv2d(1, 8, 3, 2), nn.ReLU(), nn.Conv2d(8, 8, 3, 2), nn.Tanh()))


def test_int8_convs_need_int8_dot_products() -> None:
    assert not int8_convs_supported(cpu_isa.CpuIsa(avx2=True, avx512=True))
    if torch.backends.mkldnn.is_available():
        assert int8_convs_supported(cpu_isa.CpuIsa(avx2=True, avx512=True, vnni=True))


@pytest.mark.parametrize("channels", [64, 256])
def test_the_int8_runner_picks_the_stack_this_cpu_runs_best(channels: int) -> None:
    chosen = subsampling_convs(Conv2dSubsampling(80, channels, 4).conv)
    if int8_convs_supported() and channels >= INT8_CONVS_MIN_CHANNELS:
        assert isinstance(chosen, Int8Convs)
    elif native_bf16_cpu():
        assert isinstance(chosen, Bf16Convs)
    else:
        assert isinstance(chosen, nn.Sequential)


@needs_int8_convs
@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_the_torch_int8_runner_runs_int8_convs() -> None:
    runner = make_runner("torch-int8", load_wenet_model(DEMO_MODEL))
    assert isinstance(runner, TorchChunkRunner)
    assert isinstance(runner.encoder.embed.conv, Int8Convs)
