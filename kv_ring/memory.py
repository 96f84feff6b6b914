"""Memory arithmetic for the cache pool, shared by `KvPool` and capacity planning.

One slot holds, for every encoder layer, `window` frames of keys|values per head and the
last `cnn_frames` inputs of the causal convolution, plus the absolute encoder-frame index
of each cached frame (int64)::

    bytes_per_slot = itemsize * L * (H * W * 2 * d_k + D * cnn_frames) + 8 * W
"""

from dataclasses import dataclass

import torch

POSITION_DTYPE = torch.int64


@dataclass(frozen=True, slots=True)
class PoolGeometry:
    """Shape of one slot: layers L, heads H, window W (encoder frames), d_k, d_model D, cnn_frames K-1."""

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

    @property
    def att_elements(self) -> int:
        """Elements of one slot's attention cache: L * H * W * 2 * d_k."""
        return self.num_layers * self.heads * self.window * 2 * self.d_k

    @property
    def cnn_elements(self) -> int:
        """Elements of one slot's convolution cache: L * D * cnn_frames."""
        return self.num_layers * self.d_model * self.cnn_frames

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of attention cache + convolution cache + frame positions for one slot."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        position_bytes = torch.empty((), dtype=POSITION_DTYPE).element_size() * self.window
        return itemsize * (self.att_elements + self.cnn_elements) + position_bytes


def plan_pool(
    bytes_budget: int,
    num_layers: int,
    heads: int,
    d_k: int,
    window: int,
    d_model: int,
    cnn_frames: int,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Number of slots (streams) that fit in `bytes_budget` bytes of cache memory."""
    geometry = PoolGeometry(num_layers, heads, d_k, window, d_model, cnn_frames, dtype)
    num_slots = bytes_budget // geometry.bytes_per_slot
    if num_slots < 1:
        raise ValueError(
            f"a cache budget of {bytes_budget} bytes does not hold one stream "
            f"({geometry.bytes_per_slot} bytes per slot); raise the budget or shorten the window"
        )
    return num_slots
