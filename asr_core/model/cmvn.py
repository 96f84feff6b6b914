"""Global CMVN: statistics files (WeNet JSON, Kaldi text) and the module applied in the encoder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor, nn

from asr_core.model.errors import ModelLoadError

VAR_FLOOR = 1.0e-20


def _mean_istd(mean_stat: list[float], var_stat: list[float], count: float) -> tuple[Tensor, Tensor]:
    """mean = sum/count, istd = 1/sqrt(max(sumsq/count - mean^2, 1e-20)) in float64, as WeNet."""
    means = [m / count for m in mean_stat]
    istd = [1.0 / math.sqrt(max(v / count - m * m, VAR_FLOOR)) for v, m in zip(var_stat, means, strict=True)]
    return torch.tensor(means, dtype=torch.float32), torch.tensor(istd, dtype=torch.float32)


def load_cmvn(path: str | Path, is_json: bool = True) -> tuple[Tensor, Tensor]:
    """Read CMVN stats. Returns (mean, istd), each (n_mels,) float32.

    JSON: ``{"mean_stat": [...], "var_stat": [...], "frame_num": N}``.
    Kaldi text: ``[ sum_0 .. sum_{D-1} count \\n sumsq_0 .. sumsq_{D-1} 0 ]``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(
            f"{path}: binary Kaldi CMVN is not supported; convert it with `copy-matrix --binary=false` or to WeNet JSON"
        ) from None
    try:
        if is_json:
            stats = json.loads(text)
            mean_stat = [float(v) for v in stats["mean_stat"]]
            var_stat = [float(v) for v in stats["var_stat"]]
            count = float(stats["frame_num"])
        else:
            tokens = text.split()
            if tokens[0] != "[" or tokens[-1] != "]":
                raise ValueError("expected '[ ... ]'")
            dim = (len(tokens) - 4) // 2
            mean_stat = [float(v) for v in tokens[1 : dim + 1]]
            count = float(tokens[dim + 1])
            var_stat = [float(v) for v in tokens[dim + 2 : 2 * dim + 2]]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        kind = "WeNet JSON" if is_json else "Kaldi text"
        raise ModelLoadError(f"{path}: not a valid {kind} CMVN file ({exc!r})") from None
    if len(mean_stat) != len(var_stat) or count <= 0:
        raise ModelLoadError(
            f"{path}: CMVN stats are inconsistent ({len(mean_stat)} means, "
            f"{len(var_stat)} variances, frame count {count})"
        )
    return _mean_istd(mean_stat, var_stat, count)


class GlobalCMVN(nn.Module):
    """(x - mean) * istd over the feature axis. Buffers ``mean``/``istd`` (n_mels,) as WeNet."""

    mean: Tensor
    istd: Tensor

    def __init__(self, mean: Tensor, istd: Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("istd", istd)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, n_mels) -> (B, T, n_mels)."""
        return (x - self.mean) * self.istd
