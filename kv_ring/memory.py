"""The caches' geometry (``CacheGeometry``): every shape and byte count of the pool comes from it,
for ``KvPool`` and for capacity planning (``plan_pool``).

One slot holds, for every encoder layer, `window` frames of keys|values per head and the
last `cnn_frames` inputs of the causal convolution, plus the absolute encoder-frame index
of each cached frame (int64)::

    bytes_per_slot = itemsize * L * (H * W * 2 * d_k + D * cnn_frames) + 8 * W
"""

import math
from dataclasses import dataclass

import torch

POSITION_DTYPE = torch.int64


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    """Shape of one slot: layers L, heads H, d_k, window W (encoder frames), d_model D,
    cnn_frames K-1, and the caches' dtype."""

    num_layers: int
    heads: int
    d_k: int
    window: int
    d_model: int
    cnn_frames: int
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("num_layers", "heads", "d_k", "window", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cnn_frames < 0:
            raise ValueError(f"cnn_frames must be >= 0 (kernel size - 1), got {self.cnn_frames}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"cache dtype must be a floating point type, got {self.dtype}")

    def att_shape(self, streams: int, window: int | None = None) -> tuple[int, int, int, int, int]:
        """(L, streams, H, W', 2*d_k): the attention caches of ``streams`` slots over their
        first ``window`` ring positions (default: all W)."""
        return (self.num_layers, streams, self.heads, self.window if window is None else window, 2 * self.d_k)

    def cnn_shape(self, streams: int) -> tuple[int, int, int, int]:
        """(L, streams, D, K-1): the convolution caches of ``streams`` slots."""
        return (self.num_layers, streams, self.d_model, self.cnn_frames)

    @property
    def att_elements(self) -> int:
        """Elements of one slot's attention cache: L * H * W * 2 * d_k."""
        return math.prod(self.att_shape(1))

    @property
    def cnn_elements(self) -> int:
        """Elements of one slot's convolution cache: L * D * cnn_frames."""
        return math.prod(self.cnn_shape(1))

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of attention cache + convolution cache + frame positions for one slot."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        position_bytes = torch.empty((), dtype=POSITION_DTYPE).element_size() * self.window
        return itemsize * (self.att_elements + self.cnn_elements) + position_bytes


def plan_pool(bytes_budget: int, geometry: CacheGeometry) -> int:
    """Number of slots (streams) of ``geometry`` that fit in `bytes_budget` bytes of cache memory."""
    num_slots = bytes_budget // geometry.bytes_per_slot
    if num_slots < 1:
        raise ValueError(
            f"a cache budget of {bytes_budget} bytes does not hold one stream "
            f"({geometry.bytes_per_slot} bytes per slot); raise the budget or shorten the window"
        )
    return num_slots
