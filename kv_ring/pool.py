"""A preallocated pool of windowed attention/convolution caches, one slot per stream.

Each slot is a ring of `w_s <= W` encoder frames per layer. A chunk's C new frames land at
ring index `position % w_s`; nothing is ever shifted or reordered, because every cached
frame carries its absolute encoder-frame index (`pos`) and the encoder builds its relative
position terms from it. Memory is fixed at construction: a call of any length uses one slot.

Shapes (L layers, S slots, B streams in a batch, H heads, W max window, C chunk frames,
D d_model, K-1 convolution cache frames)::

    att  (L, S, H, W, 2*d_k)   keys | values on the last axis, as in WeNet's att_cache
    pos  (S, W) int64          absolute encoder-frame index, -1 where never written
    cnn  (L, S, D, K-1)        last K-1 inputs of each causal convolution
"""

import heapq
import math
import threading
from dataclasses import dataclass

import torch

from kv_ring.errors import PoolExhausted, SlotStateError
from kv_ring.memory import POSITION_DTYPE, CacheGeometry


@dataclass(frozen=True, slots=True)
class CacheView:
    """Caches of B streams gathered for one batched encoder step (copies, not views of the pool)."""

    att: torch.Tensor  # (L, B, H, W, 2*d_k)
    pos: torch.Tensor  # (B, W) int64, -1 where masked
    mask: torch.Tensor  # (B, W) bool, True = frame is inside the stream's window
    cnn: torch.Tensor  # (L, B, D, K-1)


class KvPool:
    """Fixed pool of per-stream caches with ring writes and batched gathers.

    `allocate`/`release`/`reset` may be called from any thread (they take a lock);
    `gather`/`write` belong to the engine threads that run the batches: several may call them
    at once for disjoint sets of slots (each thread has its own staging buffer).
    Slot indices passed to `gather`/`write` are checked on the host: pass them as a CPU
    LongTensor (they are moved to the pool's device once per call).
    """

    def __init__(self, num_slots: int, geometry: CacheGeometry, device: str | torch.device = "cpu") -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.geometry = geometry
        self.num_slots = num_slots
        self.device = torch.device(device)
        window, dtype = geometry.window, geometry.dtype
        # Zero-filled, not empty: masked frames still enter the attention's value product
        # with weight 0, and 0 * NaN from uninitialised memory would poison the output.
        self.att = torch.zeros(geometry.att_shape(num_slots), dtype=dtype, device=self.device)  # (L, S, H, W, 2*d_k)
        self.pos = torch.full((num_slots, window), -1, dtype=POSITION_DTYPE, device=self.device)  # (S, W)
        self.cnn = torch.zeros(geometry.cnn_shape(num_slots), dtype=dtype, device=self.device)  # (L, S, D, K-1)
        self._windows = torch.full((num_slots,), window, dtype=torch.int64, device=self.device)  # (S,)
        self._windows_host = torch.full((num_slots,), window, dtype=torch.int64)  # (S,)
        self._frames_written = torch.zeros(num_slots, dtype=torch.int64, device=self.device)  # (S,)
        self._in_use = torch.zeros(num_slots, dtype=torch.bool)  # (S,) host
        self._free: list[int] = list(range(num_slots))
        self._lock = threading.Lock()
        self._staging_local = threading.local()

    @property
    def window(self) -> int:
        """Largest window W (encoder frames) any slot can have."""
        return self.geometry.window

    @property
    def dtype(self) -> torch.dtype:
        return self.geometry.dtype

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.num_slots - len(self._free)

    @property
    def bytes_per_slot(self) -> int:
        return self.geometry.bytes_per_slot

    @property
    def total_bytes(self) -> int:
        return self.geometry.bytes_per_slot * self.num_slots

    def describe(self) -> dict[str, int | str]:
        """Pool size and occupancy, for logs, metrics and `asr-bench` output."""
        g = self.geometry
        return {
            "slots": self.num_slots,
            "used": self.used_slots,
            "layers": g.num_layers,
            "heads": g.heads,
            "window": g.window,
            "d_k": g.d_k,
            "d_model": g.d_model,
            "cnn_frames": g.cnn_frames,
            "dtype": str(g.dtype).removeprefix("torch."),
            "device": str(self.device),
            "bytes_per_slot": self.bytes_per_slot,
            "total_bytes": self.total_bytes,
        }

    def allocate(self, window: int) -> int:
        """Take a free slot for a new stream keeping `window` encoder frames; it starts empty.

        `window` is the stream's `left_chunks * chunk_frames`.
        """
        if not 1 <= window <= self.window:
            raise ValueError(
                f"stream window must be 1..{self.window} encoder frames (the pool's window), got {window}; "
                "use fewer left chunks or a smaller chunk, or build the pool with a larger window"
            )
        with self._lock:
            if not self._free:
                raise PoolExhausted(
                    f"all {self.num_slots} cache slots are in use; the node is at capacity "
                    "(raise the pool size if memory allows, or route calls to another node)"
                )
            slot = heapq.heappop(self._free)
            self._in_use[slot] = True
            self._windows[slot] = window
            self._windows_host[slot] = window
            self._clear(slot)
        return slot

    def release(self, slot: int) -> None:
        """Return a slot to the pool; it is cleared when next allocated."""
        with self._lock:
            self._require_in_use(slot, "release")
            self._in_use[slot] = False
            heapq.heappush(self._free, slot)

    def reset(self, slot: int) -> None:
        """Forget a stream's history (new utterance after an endpoint); keeps the slot and its window."""
        with self._lock:
            self._require_in_use(slot, "reset")
            self._clear(slot)

    def window_of(self, slot: int) -> int:
        """The window w_s (encoder frames) the slot was allocated with."""
        self._require_in_use(slot, "query")
        return int(self._windows_host[slot])

    def frames_written(self, slot: int) -> int:
        """Encoder frames written to the slot since it was allocated or last reset."""
        self._require_in_use(slot, "query")
        return int(self._frames_written[slot])

    def gather(self, slots: torch.Tensor, reuse_buffer: bool = False, window: int | None = None) -> CacheView:
        """Batched copy of the caches of `slots` (B,) for one encoder step.

        A frame is valid when it was written since the last reset and lies within the
        last w_s positions of its stream; everything else is masked (and its pos is -1).

        With `reuse_buffer`, att and cnn are written into a pool-owned staging buffer of the
        calling thread (grown once to the largest batch seen) and stay valid only until that
        thread's next such gather. On CPU this avoids page-faulting a fresh B * bytes_per_slot buffer every
        step, which costs several times the copy itself.

        `window`: only the first `window` ring positions (W' <= W; at least every slot's w_s,
        whose frames only ever land at `position % w_s`), so that a batch of streams with
        small windows does not attend over the pool's largest window of masked frames.
        """
        index, pos, mask = self.positions(slots, window)
        att_source = self.attention_cache(pos.shape[1])
        if reuse_buffer:
            att_out, cnn_out = self._staging(index.numel(), pos.shape[1])
            att = torch.index_select(att_source, 1, index, out=att_out)
            cnn = torch.index_select(self.cnn, 1, index, out=cnn_out)
        else:
            att = att_source.index_select(1, index)
            cnn = self.cnn.index_select(1, index)
        return CacheView(att=att, pos=pos, mask=mask, cnn=cnn)

    def positions(
        self, slots: torch.Tensor, window: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What ``gather`` returns of `slots` (B,) besides the copies, for a step that reads the
        caches where they lie (rows ``index`` of ``attention_cache(W')`` and `cnn`, along dim 1):
        (index (B,) on the pool's device, pos (B, W') int64 with -1 where masked, mask (B, W')
        bool), W' = `window` (default W). Checked as ``gather`` checks them."""
        host, index = self._indices(slots, "gather")  # (B,)
        width = self.window if window is None else window
        widest = int(self._windows_host[host].max()) if host.numel() else 1
        if not widest <= width <= self.window:
            raise ValueError(
                f"window must be {widest}..{self.window} (the slots' largest window .. the pool's), got {width}"
            )
        pos = self.pos[:, :width].index_select(0, index)  # (B, W')
        windows = self._windows.index_select(0, index).unsqueeze(1)  # (B, 1)
        end = pos.amax(dim=1, keepdim=True) + 1  # (B, 1) one past the newest position; 0 if empty
        mask = (pos >= 0) & (pos >= end - windows)  # (B, W')
        return index, pos.masked_fill(~mask, -1), mask

    def attention_cache(self, window: int | None = None) -> torch.Tensor:
        """The attention cache (L, S, H, W', 2*d_k) over its first `window` ring positions (a view)."""
        return self.att if window is None or window == self.window else self.att[:, :, :, :window]

    def write(
        self,
        slots: torch.Tensor,
        new_kv: torch.Tensor,
        positions: torch.Tensor,
        new_cnn: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> None:
        """Ring-write each stream's C new frames and replace its convolution cache.

        Args:
            slots: (B,) distinct allocated slots.
            new_kv: (L, B, H, C, 2*d_k) keys|values of this chunk's frames.
            positions: (B, C) int64 absolute encoder-frame index of each new frame; each row
                must be consecutive (offset + arange(C)), so that its C <= w_s ring indices
                `position % w_s` are distinct.
            new_cnn: (L, B, D, K-1).
            lengths: (B,) valid frames per stream when streams in the batch have fewer than
                C frames (short last chunk, smaller chunk size); frames at c >= length are
                not written. None means all C frames are valid.
        """
        host, index = self._indices(slots, "write", distinct=True)  # (B,)
        g = self.geometry
        batch = index.numel()
        chunk = new_kv.shape[3] if new_kv.dim() == 5 else -1
        expected_kv = g.att_shape(batch, chunk)
        if tuple(new_kv.shape) != expected_kv:
            raise ValueError(f"new_kv must have shape (L, B, H, C, 2*d_k) = {expected_kv}, got {tuple(new_kv.shape)}")
        if tuple(positions.shape) != (batch, chunk) or positions.dtype != POSITION_DTYPE:
            raise ValueError(
                f"positions must be int64 of shape (B, C) = {(batch, chunk)}, "
                f"got {positions.dtype} {tuple(positions.shape)}"
            )
        expected_cnn = g.cnn_shape(batch)
        if tuple(new_cnn.shape) != expected_cnn:
            raise ValueError(f"new_cnn must have shape (L, B, D, K-1) = {expected_cnn}, got {tuple(new_cnn.shape)}")
        smallest_window = int(self._windows_host[host].min()) if batch else chunk
        if chunk > smallest_window:
            raise ValueError(
                f"a chunk of {chunk} frames does not fit a slot window of {smallest_window} frames; "
                "a stream's window must hold at least one chunk"
            )
        if batch == 0:
            return
        positions = positions.to(self.device)
        ring = positions % self._windows.index_select(0, index).unsqueeze(1)  # (B, C)
        rows = index.unsqueeze(1)  # (B, 1), broadcasts against ring
        # Advanced indices on dims 1 and 3 are split by a slice, so the indexed shape puts
        # the broadcast (B, C) first: (B, C, L, H, 2*d_k).
        values = new_kv.to(g.dtype).permute(1, 3, 0, 2, 4)  # (B, C, L, H, 2*d_k)
        if lengths is None:
            written = torch.full((batch,), chunk, dtype=torch.int64, device=self.device)
        else:
            written = lengths.to(device=self.device, dtype=torch.int64)  # (B,)
            valid = torch.arange(chunk, device=self.device).unsqueeze(0) < written.unsqueeze(1)  # (B, C)
            values = torch.where(valid[:, :, None, None, None], values, self.att[:, rows, :, ring])
            positions = torch.where(valid, positions, self.pos[rows, ring])
        self.att[:, rows, :, ring] = values
        self.pos[rows, ring] = positions
        self.cnn.index_copy_(1, index, new_cnn.to(g.dtype))
        self._frames_written.index_add_(0, index, written)

    def _staging(self, batch: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous (L, B, H, W', 2*d_k) and (L, B, D, K-1) views over reusable flat buffers."""
        g = self.geometry
        local = self._staging_local
        if getattr(local, "batch", 0) < batch:
            local.att = torch.empty(batch * g.att_elements, dtype=g.dtype, device=self.device)
            local.cnn = torch.empty(batch * g.cnn_elements, dtype=g.dtype, device=self.device)
            local.batch = batch
        att_shape = g.att_shape(batch, window)
        att = local.att[: math.prod(att_shape)].view(att_shape)
        cnn = local.cnn[: batch * g.cnn_elements].view(g.cnn_shape(batch))
        return att, cnn

    def _clear(self, slot: int) -> None:
        self.att[:, slot].zero_()
        self.pos[slot].fill_(-1)
        self.cnn[:, slot].zero_()
        self._frames_written[slot] = 0

    def _require_in_use(self, slot: int, action: str) -> None:
        if not 0 <= slot < self.num_slots:
            raise SlotStateError(f"cannot {action} slot {slot}: the pool has slots 0..{self.num_slots - 1}")
        if not bool(self._in_use[slot]):
            raise SlotStateError(f"cannot {action} slot {slot}: it is not allocated (released twice?)")

    def _indices(self, slots: torch.Tensor, action: str, distinct: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Check slot indices on the host; return them on the host and on the pool's device."""
        if slots.dim() != 1 or slots.dtype != torch.int64:
            raise ValueError(f"slots must be a 1-D int64 tensor, got {slots.dtype} of shape {tuple(slots.shape)}")
        host = slots.to("cpu")
        if host.numel():
            out_of_range = (host < 0) | (host >= self.num_slots)
            if bool(out_of_range.any()):
                bad = host[out_of_range].tolist()
                raise SlotStateError(f"cannot {action} slots {bad}: the pool has slots 0..{self.num_slots - 1}")
            idle = ~self._in_use[host]
            if bool(idle.any()):
                raise SlotStateError(f"cannot {action} slots {host[idle].tolist()}: they are not allocated")
            if distinct and host.unique().numel() != host.numel():
                raise ValueError(f"cannot {action} a batch that names a slot twice: {host.tolist()}")
        return host, slots.to(self.device)
