"""Multi-head attention: plain (``selfattn``, decoder) and WeNet's ``rel_selfattn``.

WeNet's rel_selfattn (at the fixture's commit) scores a query against a key as

    ((q + pos_bias_u) . k + (q + pos_bias_v) . linear_pos(pe[pos_k])) / sqrt(d_k)

with NO rel_shift, so the position term depends only on the key's ABSOLUTE position. That is
what lets a batch mix streams at different offsets whose caches are in any order: each key
carries its own position. ``linear_pos`` has no bias and the sinusoid is fixed, so in eval mode
the projected table ``linear_pos(pe[0:N])`` is computed once per layer and rows are gathered.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from asr_core.model.embedding import sinusoid
from asr_core.model.inference import exporting, may_cache_derived, weights_key

MIN_TABLE_ROWS = 1024


@dataclass(frozen=True)
class RowPacking:
    """Query rows laid out over the memory rows they attend (an utterance's hypotheses share
    its memory row), so that source attention reads each memory row's keys and values where
    they lie instead of gathering a copy of them for every query row.

    The query rows of one memory row become consecutive query positions of one packed row:
    query row i is position ``slot[i]`` of packed row ``line[i]``. Packed rows are the memory
    rows that have queries (``memory_rows``; None: all of them, in order), ``width`` positions
    each (the most query rows of one memory row; shorter ones are padded and discarded).
    """

    line: Tensor  # (N,) long
    slot: Tensor  # (N,) long
    width: int
    memory_rows: Tensor | None  # (S',) long

    @classmethod
    def of(cls, rows: Tensor, memory_count: int) -> RowPacking:
        """The packing of query rows attending memory rows ``rows`` (N,) of ``memory_count``."""
        counts = torch.bincount(rows, minlength=memory_count)
        order = torch.argsort(rows, stable=True)
        starts = counts.cumsum(0) - counts
        slot = torch.empty_like(rows)
        slot[order] = torch.arange(rows.numel(), device=rows.device) - starts[rows[order]]
        width = int(counts.max()) if rows.numel() else 0
        present = counts > 0
        if bool(present.all()):
            return cls(rows, slot, width, None)
        return cls((present.cumsum(0) - 1)[rows], slot, width, present.nonzero().squeeze(1))

    def memory_row_of_each(self) -> Tensor:
        """(N,) the memory row each query row attends (what :meth:`of` was given)."""
        return self.line if self.memory_rows is None else self.memory_rows[self.line]


def dot_products(q: Tensor, k: Tensor) -> Tensor:
    """(..., T1, d) x (..., T2, d) -> (..., T1, T2): every query's dot product with every key.

    A streaming chunk has few queries (4-16 frames) and more keys (the cache window plus the
    chunk). Which way round the CPU's batched GEMM computes that fastest depends on the CPU's
    BLAS path: on a Xeon (AVX512-VNNI) ``(k @ q^T)^T`` with ``q^T`` contiguous ran twice as fast
    as ``q @ k^T`` (AISHELL size, 28 streams: 499 -> 250 us per layer), on an AMD EPYC, where MKL
    takes its generic path, four times slower (48 streams: 478 against 112 us per product;
    docs/BENCHMARKS.md). So the order is measured once per shape on this CPU
    (:func:`keys_first`); with as many queries as keys, off the CPU, and in exported graphs,
    the plain product is kept.
    """
    if exporting() or q.size(-2) >= k.size(-2) or not keys_first(q, k):
        return _queries_by_keys(q, k)
    return _keys_by_queries(q, k)


def _queries_by_keys(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T``: the plain order of :func:`dot_products`."""
    return torch.matmul(q, k.transpose(-2, -1))


def _keys_by_queries(q: Tensor, k: Tensor) -> Tensor:
    """``(k @ q^T)^T`` with ``q^T`` contiguous: the other order of :func:`dot_products`."""
    return torch.matmul(k, q.transpose(-2, -1).contiguous()).transpose(-2, -1)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool attention mask (True = keep) as the additive bias ``MultiHeadedAttention.attend``
    and torch's fused kernel take: 0 where kept, -inf where masked. Only for masks that keep at
    least one key for every query (a query with none would get NaN, not WeNet's zeros)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


ORIENTATION_ROWS = 128
"""Query/key matrices per timed product when :func:`keys_first` measures a shape (about 32
streams' worth of heads: the batches where the choice matters)."""

_keys_first: dict[tuple[int, int, int, torch.dtype], bool] = {}


def keys_first(q: Tensor, k: Tensor) -> bool:
    """Whether :func:`dot_products` of queries like ``q`` (..., T1, d) and keys like ``k``
    (..., T2, d) runs faster as ``(k @ q^T)^T`` on this CPU: timed once per (T1, T2, d, dtype)
    in this process on random operands of ``ORIENTATION_ROWS`` matrices (a few ms), then
    remembered. False off the CPU, and while tracing a shape not timed yet (the traced chunk
    step runs each shape eagerly first, so its graph gets the measured order)."""
    if q.device.type != "cpu":
        return False
    shape = (q.size(-2), k.size(-2), q.size(-1), q.dtype)
    known = _keys_first.get(shape)
    if known is None:
        if torch.jit.is_tracing():
            return False
        known = _keys_first[shape] = _time_keys_first(*shape)
    return known


def _time_keys_first(queries: int, keys: int, d: int, dtype: torch.dtype, rounds: int = 5, calls: int = 8) -> bool:
    """Time both orders of the product on random operands, alternated; the faster one's best
    round wins."""
    with torch.inference_mode():
        q = torch.randn(ORIENTATION_ROWS, queries, d).to(dtype)
        k = torch.randn(ORIENTATION_ROWS, keys, d).to(dtype)
        best = [float("inf"), float("inf")]
        for _ in range(rounds):
            for i, product in enumerate((_queries_by_keys, _keys_by_queries)):
                started = time.perf_counter()
                for _ in range(calls):
                    product(q, k)
                best[i] = min(best[i], time.perf_counter() - started)
    return best[1] < best[0]


class MultiHeadedAttention(nn.Module):
    """Scaled dot-product attention with ``linear_q/k/v/out`` (WeNet names)."""

    plain_scores = True
    """Scores are q . k / sqrt(d_k) alone, so eval mode may run torch's fused kernel (:meth:`attend_scaled`)."""

    def __init__(
        self,
        n_head: int,
        n_feat: int,
        dropout_rate: float,
        query_bias: bool = True,
        key_bias: bool = True,
        value_bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat, bias=query_bias)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat, bias=value_bias)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.dropout = nn.Dropout(dropout_rate)
        self.qkv_projection: nn.Module | None = None
        """Replaces the fused q/k|v matmul of ``forward_cached`` when set (a backend installs a
        quantized ``fused_qkv_linear()`` here); the separate linears stay for ``forward``."""
        self._fused: tuple[Tensor, Tensor | None] | None = None
        self._fused_key: tuple[object, ...] = ()

    def _heads(self, x: Tensor, linear: nn.Module) -> Tensor:
        """(B, T, D) -> (B, H, T, d_k)."""
        b, t, _ = x.shape
        return linear(x).view(b, t, self.h, self.d_k).transpose(1, 2)

    def _fused_qkv(self) -> tuple[Tensor, Tensor | None]:
        """``linear_q/k/v`` as one (3D, D) weight and (3D,) bias, rows ordered
        [q | head 0 (k | v) | head 1 (k | v) | ...] so that one matmul yields the queries and the
        new frames' keys|values already in att_cache layout. Cached while ``may_cache_derived``
        (until a weight changes); rebuilt from the parameters otherwise, so gradients flow."""
        linears = (self.linear_q, self.linear_k, self.linear_v)
        weights = [lin.weight for lin in linears]
        biases = [lin.bias for lin in linears]
        cache = may_cache_derived(self)
        key = weights_key(*weights, *biases) if cache else ()
        if cache and self._fused is not None and self._fused_key == key:
            return self._fused
        d, dk = self.h * self.d_k, self.d_k

        def interleave(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            """q, k, v: (D, ...) -> (3D, ...) rows [q | per head (k | v)]."""
            kv = torch.stack((k.reshape(self.h, dk, -1), v.reshape(self.h, dk, -1)), dim=1)  # (H, 2, d_k, ...)
            return torch.cat((q.reshape(d, -1), kv.reshape(2 * d, -1)), dim=0).view((3 * d, *q.shape[1:]))

        weight = interleave(*weights)
        bias: Tensor | None = None
        if any(b is not None for b in biases):
            zeros = weight.new_zeros(d)
            q_b, k_b, v_b = (zeros if b is None else b for b in biases)
            bias = interleave(q_b, k_b, v_b)
        if cache:
            self._fused = (weight, bias)
            self._fused_key = key
        return weight, bias

    def fused_qkv_linear(self) -> nn.Linear:
        """``linear_q/k/v`` as one ``nn.Linear(D, 3D)`` (weights copied, rows as ``_fused_qkv``)."""
        with torch.no_grad():
            weight, bias = self._fused_qkv()
            linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
            linear.to(weight.device, weight.dtype)
            linear.weight.copy_(weight)
            if bias is not None and linear.bias is not None:
                linear.bias.copy_(bias)
        return linear

    def scores(self, q: Tensor, k: Tensor, key_positions: Tensor | None, table_rows: int) -> Tensor:
        """q: (B, H, T1, d_k), k: (B, H, T2, d_k) -> (B, H, T1, T2) unnormalised scores."""
        return torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, scores: Tensor, mask: Tensor | None) -> Tensor:
        """Masked softmax over keys and weighted sum of values.

        scores: (B, H, T1, T2); v: (B, H, T2, d_k); mask: (B, 1 or T1, T2) bool (True = keep), or
        float, added to the scores (:meth:`kernel_mask`).
        Masked keys get -inf; a row with every key masked yields zeros (as WeNet).
        Returns (B, T1, D).
        """
        if mask is not None and mask.is_floating_point():  # an additive bias (:meth:`kernel_mask`)
            attn = torch.softmax(scores + mask.unsqueeze(1), dim=-1)
        elif mask is not None:
            drop = ~mask.unsqueeze(1)  # (B, 1, 1|T1, T2)
            scores = scores.masked_fill(drop, -float("inf"))
            attn = torch.softmax(scores, dim=-1).masked_fill(drop, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        x = torch.matmul(self.dropout(attn), v)  # (B, H, T1, d_k)
        b, _, t1, _ = x.shape
        return self.linear_out(x.transpose(1, 2).reshape(b, t1, self.h * self.d_k))

    def attend_scaled(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """``attend(q, k, v, scores(q, k, None, 0), mask)`` for plain scores; in eval mode by torch's
        fused ``scaled_dot_product_attention``: one pass, no (T1, T2) score tensors to fill, mask
        and normalise (the decoder's prefix trees on CPU: 1.6-2.9x faster, docs/BENCHMARKS.md), and
        WeNet's zeros for a query whose keys are all masked. Training (its attention dropout) and
        exported graphs keep the explicit path."""
        if self.training or not self.plain_scores or exporting():
            return self.attend(q, k, v, self.scores(q, k, None, 0), mask)
        x = self.fused_attention(q, k, v, mask)
        b, _, t1, _ = x.shape
        return self.linear_out(x.transpose(1, 2).reshape(b, t1, self.h * self.d_k))

    def kernel_mask(self, mask: Tensor, dtype: torch.dtype) -> Tensor:
        """``mask`` (B, 1|T1, T2) bool, prepared once for many attention calls of the same shape
        (every layer of a decoder): when this module runs torch's fused kernel and every query
        keeps at least one key, as the additive bias the kernel takes (0 kept, -inf masked), so
        that each call neither converts the mask again nor looks for all-masked queries (the
        prefix trees' node-by-node masks: a quarter of their self-attention); else unchanged."""
        if self.training or not self.plain_scores or exporting() or not bool(mask.any(dim=-1).all()):
            return mask
        return additive_mask(mask, dtype)

    @staticmethod
    def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """torch's fused kernel on heads: (B, H, T1, d_k) -> (B, H, T1, d_k); mask (B, 1|T1, T2)
        bool (True = keep): a query whose keys are all masked gets zeros, as WeNet; or float,
        an additive bias with a kept key for every query (:meth:`kernel_mask`)."""
        if mask is None:
            return nn.functional.scaled_dot_product_attention(q, k, v)
        if mask.is_floating_point():
            return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
        keep = mask.unsqueeze(1)  # (B, 1, 1|T1, T2)
        x = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return x.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)  # all-masked rows: zeros, not NaN

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        key_positions: Tensor | None = None,
        table_rows: int = 0,
    ) -> Tensor:
        """query: (B, T1, D); key/value: (B, T2, D); mask: (B, 1|T1, T2) bool -> (B, T1, D)."""
        q = self._heads(query, self.linear_q)
        k = self._heads(key, self.linear_k)
        v = self._heads(value, self.linear_v)
        if self.plain_scores:
            return self.attend_scaled(q, k, v, mask)
        return self.attend(q, k, v, self.scores(q, k, key_positions, table_rows), mask)

    def forward_shared_memory(self, query: Tensor, memory: Tensor, memory_mask: Tensor, rows: Tensor) -> Tensor:
        """Source attention where many query rows share a memory row (an utterance's n-best).

        query: (N, T1, D); memory: (S, T2, D); memory_mask: (S, 1, T2) bool; rows: (N,) long,
        the memory row of each query row. Keys and values are projected once per memory row
        and then gathered, instead of projecting each hypothesis' copy of the same memory.
        Returns (N, T1, D), the same as ``forward(query, memory[rows], memory[rows], mask[rows])``.
        """
        return self.attend_memory(query, *self.memory_keys_values(memory), memory_mask, rows)

    def memory_keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a source memory (S, T2, D): two (S, H, T2, d_k) tensors.

        An autoregressive search queries the same memory at every step; projecting it once
        and passing the result to :meth:`attend_memory` saves doing so per step.
        """
        return self._heads(memory, self.linear_k), self._heads(memory, self.linear_v)

    def attend_memory(
        self, query: Tensor, keys: Tensor, values: Tensor, memory_mask: Tensor, rows: Tensor | RowPacking
    ) -> Tensor:
        """``forward_shared_memory`` with the memory already projected (:meth:`memory_keys_values`).

        ``rows``: the memory row of each query row, or their :class:`RowPacking` (a caller that
        attends the same rows in several layers packs them once). In eval mode the query rows
        are packed (:class:`RowPacking`) and each memory row's keys are read in place: gathering
        them per query row copied (N, H, T', d_k) twice per layer, which cost the attention
        decoder's beam search more than the attention itself.
        """
        q = self._heads(query, self.linear_q)  # (N, H, T1, d_k)
        if self.training or not self.plain_scores or exporting():
            index = rows.memory_row_of_each() if isinstance(rows, RowPacking) else rows
            k, v = keys.index_select(0, index), values.index_select(0, index)
            return self.attend_scaled(q, k, v, memory_mask.index_select(0, index))
        packing = rows if isinstance(rows, RowPacking) else RowPacking.of(rows, keys.size(0))
        if packing.memory_rows is not None:
            keys, values = keys.index_select(0, packing.memory_rows), values.index_select(0, packing.memory_rows)
            memory_mask = memory_mask.index_select(0, packing.memory_rows)
        n, h, t1, dk = q.shape
        packed = q.new_zeros(keys.size(0), packing.width, h, t1, dk)
        packed[packing.line, packing.slot] = q
        packed_q = packed.permute(0, 2, 1, 3, 4).reshape(keys.size(0), h, packing.width * t1, dk)
        x = self.fused_attention(packed_q, keys, values, memory_mask)  # (S', H, width * T1, d_k)
        x = x.view(keys.size(0), h, packing.width, t1, dk).permute(0, 2, 1, 3, 4)[packing.line, packing.slot]
        return self.linear_out(x.transpose(1, 2).reshape(n, t1, h * dk))

    def attend_step(self, x: Tensor, cache: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Self-attention of one new position over itself and every earlier one, whose keys and
        values are kept from earlier steps instead of projected again (autoregressive decoding).

        x: (N, 1, D) the new position's input; cache: the keys and values (N, H, L, d_k) of the
        L earlier positions (None at the first). Returns (y (N, 1, D), keys and values
        (N, H, L + 1, d_k) of every position so far).
        """
        q = self._heads(x, self.linear_q)
        k, v = self._heads(x, self.linear_k), self._heads(x, self.linear_v)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        return self.attend_scaled(q, k, v, None), (k, v)

    def forward_cached(
        self,
        x: Tensor,
        kv_cache: Tensor,
        mask: Tensor | None,
        key_positions: Tensor | None,
        table_rows: int,
    ) -> tuple[Tensor, Tensor]:
        """Self-attention of new frames over cached + new keys.

        x: (B, T, D) new frames; kv_cache: (B, H, W, 2*d_k) cached keys|values (W may be 0);
        mask: (B, 1|T, W+T) bool, or the additive float bias ``attend`` takes; key_positions:
        (B|1, W+T) int64 absolute frame index of every key (cache first, then the new frames).
        Returns (y (B, T, D), kv_new (B, H, T, 2*d_k) keys|values of the new frames).
        """
        b, t, d = x.shape
        if self.qkv_projection is not None:
            qkv = self.qkv_projection(x)  # (B, T, 3D)
        else:
            weight, bias = self._fused_qkv()
            qkv = nn.functional.linear(x, weight, bias)
        q = qkv[..., :d].view(b, t, self.h, self.d_k).transpose(1, 2)  # (B, H, T, d_k)
        kv_new = qkv[..., d:].view(b, t, self.h, 2 * self.d_k).transpose(1, 2)  # (B, H, T, 2*d_k)
        kv = torch.cat((kv_cache, kv_new), dim=2)  # (B, H, W+T, 2*d_k)
        k, v = kv[..., : self.d_k], kv[..., self.d_k :]
        y = self.attend(q, k, v, self.scores(q, k, key_positions, table_rows), mask)
        return y, kv_new


class RelPositionMultiHeadedAttention(MultiHeadedAttention):
    """WeNet's rel_selfattn: adds ``linear_pos`` (no bias), ``pos_bias_u``, ``pos_bias_v``."""

    plain_scores = False

    def __init__(
        self,
        n_head: int,
        n_feat: int,
        dropout_rate: float,
        query_bias: bool = True,
        key_bias: bool = True,
        value_bias: bool = True,
    ) -> None:
        super().__init__(n_head, n_feat, dropout_rate, query_bias, key_bias, value_bias)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)
        self._table: Tensor | None = None
        self._table_key: tuple[object, ...] = ()

    def _projected_table(self, rows: int) -> Tensor:
        """linear_pos(pe[0:N]) head-major as (H, N, d_k), N >= rows, cached until the weight
        changes."""
        weight = self.linear_pos.weight
        key = weights_key(weight)
        if self._table is None or self._table_key != key or self._table.size(1) < rows:
            n = max(MIN_TABLE_ROWS, 1 << (rows - 1).bit_length())
            with torch.no_grad():
                positions = torch.arange(n, device=weight.device)
                table = self.linear_pos(sinusoid(positions, weight.size(1)).to(weight.dtype))  # (N, D)
            self._table = table.view(n, self.h, self.d_k).transpose(0, 1).contiguous()
            self._table_key = key
        return self._table

    def position_scores(self, q_v: Tensor, key_positions: Tensor, table_rows: int) -> Tensor:
        """q_v: (B, H, T1, d_k) queries + pos_bias_v; key_positions: (B|1, T2) int64 ->
        (B, H, T1, T2) dot products with the projected embedding of each key's position.

        table_rows > 0: gather from the cached table (positions clamped to [0, table_rows)),
        head-major so that the gathered keys feed the matmul without a transposing copy;
        0: project on the fly (training, export, or positions beyond the table limit).
        """
        b, k = key_positions.shape
        if table_rows > 0:
            table = self._projected_table(table_rows)  # (H, N, d_k)
            index = key_positions.clamp(0, table_rows - 1).reshape(-1)
            p = table.index_select(1, index).view(self.h, b, k, self.d_k)  # (H, B|1, T2, d_k)
            return dot_products(q_v.transpose(0, 1), p).transpose(0, 1)
        pe = sinusoid(key_positions, self.linear_pos.in_features).to(self.linear_pos.weight.dtype)
        p = self.linear_pos(pe).view(b, k, self.h, self.d_k).transpose(1, 2)  # (B|1, H, T2, d_k)
        return torch.matmul(q_v, p.transpose(-2, -1))

    def scores(self, q: Tensor, k: Tensor, key_positions: Tensor | None, table_rows: int) -> Tensor:
        """q: (B, H, T1, d_k), k: (B, H, T2, d_k), key_positions (B|1, T2) -> (B, H, T1, T2)."""
        if key_positions is None:
            raise ValueError("rel_selfattn needs the absolute position of every key")
        matrix_ac = dot_products(q + self.pos_bias_u.unsqueeze(1), k)
        matrix_bd = self.position_scores(q + self.pos_bias_v.unsqueeze(1), key_positions, table_rows)
        return (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
