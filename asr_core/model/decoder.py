"""Attention decoders: ``TransformerDecoder`` and U2++'s ``BiTransformerDecoder``.

Both return LOG-SOFTMAX outputs (WeNet's decoders return logits and
``ASRModel.forward_attention_decoder`` applies log_softmax; here the decoder does it, and the
label-smoothing loss is unchanged because log_softmax is idempotent).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from asr_core.model.attention import MultiHeadedAttention, RowPacking
from asr_core.model.config import DecoderConfig
from asr_core.model.embedding import PositionalEncoding
from asr_core.model.feed_forward import PositionwiseFeedForward
from asr_core.model.inference import exporting
from asr_core.model.mask import make_pad_mask, subsequent_mask

Tree = tuple[Tensor, Tensor, Tensor]
"""A batch of prefix trees: tokens (S, N), positions (S, N), ancestor mask (S, N, N)."""
SourceAttention = Callable[[Tensor], Tensor]
MemoryKeysValues = list[tuple[Tensor, Tensor]]
"""Per decoder layer, its source attention's keys and values of the memory, (S, H, T', d_k) each."""


class DecoderLayer(nn.Module):
    """Self-attention (causal) -> source attention over the encoder output -> FFN."""

    def __init__(self, size: int, conf: DecoderConfig) -> None:
        super().__init__()
        bias = (conf.query_bias, conf.key_bias, conf.value_bias)
        h = conf.attention_heads
        self.self_attn = MultiHeadedAttention(h, size, conf.self_attention_dropout_rate, *bias)
        self.src_attn = MultiHeadedAttention(h, size, conf.src_attention_dropout_rate, *bias)
        self.feed_forward = PositionwiseFeedForward(size, conf.linear_units, conf.dropout_rate, conf.activation_type)
        self.norm1 = nn.LayerNorm(size, eps=1e-5)
        self.norm2 = nn.LayerNorm(size, eps=1e-5)
        self.norm3 = nn.LayerNorm(size, eps=1e-5)
        self.dropout = nn.Dropout(conf.dropout_rate)
        self.normalize_before = conf.normalize_before

    def forward(
        self, tgt: Tensor, tgt_mask: Tensor, memory: Tensor, memory_mask: Tensor, memory_rows: Tensor | None = None
    ) -> Tensor:
        """tgt: (N, L, D); tgt_mask: (N, L, L); memory: (N, T', D); memory_mask: (N, 1, T').

        With ``memory_rows`` (N,), memory and memory_mask hold S < N distinct rows and target
        row i attends to memory row ``memory_rows[i]`` (hypotheses of one utterance).
        """
        if memory_rows is None:
            source: SourceAttention = partial(self.src_attn, key=memory, value=memory, mask=memory_mask)
        else:
            source = partial(
                self.src_attn.forward_shared_memory, memory=memory, memory_mask=memory_mask, rows=memory_rows
            )
        return self._source_block(self._self_block(tgt, tgt_mask), source)

    def forward_step(
        self,
        x: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        memory_keys: Tensor,
        memory_values: Tensor,
        memory_mask: Tensor,
        memory_rows: RowPacking,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The layer's output at one new position, ``forward(all positions, causal mask, ...)[:, -1:]``.

        x: (N, 1, D) the new position's input; cache: the self-attention's keys and values of
        the earlier positions (None at the first; :meth:`MultiHeadedAttention.attend_step`);
        memory_keys/values: the source attention's projection of the memory
        (``MultiHeadedAttention.memory_keys_values``, S rows); memory_rows: the memory row of
        each target row, packed. Returns ((N, 1, D), the keys and values of every position).
        """
        nb = self.normalize_before
        attended, kv = self.self_attn.attend_step(self.norm1(x) if nb else x, cache)
        x = x + self.dropout(attended)
        source = partial(
            self.src_attn.attend_memory,
            keys=memory_keys,
            values=memory_values,
            memory_mask=memory_mask,
            rows=memory_rows,
        )
        return self._source_block(x if nb else self.norm1(x), source), kv

    def _self_block(self, tgt: Tensor, tgt_mask: Tensor) -> Tensor:
        nb = self.normalize_before
        x = self.norm1(tgt) if nb else tgt
        x = tgt + self.dropout(self.self_attn(x, x, x, tgt_mask))
        return x if nb else self.norm1(x)

    def _source_block(self, x: Tensor, attend_source: SourceAttention) -> Tensor:
        nb = self.normalize_before
        y = self.norm2(x) if nb else x
        x = x + self.dropout(attend_source(y))
        x = x if nb else self.norm2(x)
        y = self.norm3(x) if nb else x
        x = x + self.dropout(self.feed_forward(y))
        return x if nb else self.norm3(x)


class TransformerDecoder(nn.Module):
    """Token embedding + absolute positions -> blocks -> after_norm -> output_layer -> log_softmax."""

    def __init__(self, vocab_size: int, d_model: int, conf: DecoderConfig, num_blocks: int) -> None:
        super().__init__()
        self.embed = nn.Sequential(
            nn.Embedding(vocab_size, d_model), PositionalEncoding(d_model, conf.positional_dropout_rate)
        )
        self.normalize_before = conf.normalize_before
        self.after_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.output_layer = nn.Linear(d_model, vocab_size)
        self.decoders = nn.ModuleList(DecoderLayer(d_model, conf) for _ in range(num_blocks))

    def forward(
        self,
        memory: Tensor,
        memory_mask: Tensor,
        ys_in_pad: Tensor,
        ys_in_lens: Tensor,
        r_ys_in_pad: Tensor | None = None,
        reverse_weight: float = 0.0,
        memory_rows: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """memory: (N, T', D); memory_mask: (N, 1, T') bool; ys_in_pad: (N, L) int64 starting
        with sos; ys_in_lens: (N,). Returns (log-probs (N, L, V), empty tensor): row j
        predicts token j+1; a unidirectional decoder has no right-to-left output.
        ``memory_rows`` (N,): memory has fewer rows, shared (see ``DecoderLayer.forward``)."""
        length = ys_in_pad.size(1)
        tgt_mask = ~make_pad_mask(ys_in_lens, length).unsqueeze(1)  # (N, 1, L)
        tgt_mask = tgt_mask & subsequent_mask(length, ys_in_pad.device).unsqueeze(0)  # (N, L, L)
        positions = torch.arange(length, device=ys_in_pad.device)
        logp = self.forward_prefix_tree(memory, memory_mask, ys_in_pad, positions, tgt_mask, memory_rows)
        return logp, logp.new_zeros(0)

    def forward_prefix_tree(
        self,
        memory: Tensor,
        memory_mask: Tensor,
        tokens: Tensor,
        positions: Tensor,
        tree_mask: Tensor,
        memory_rows: Tensor | None = None,
    ) -> Tensor:
        """Decode every prefix of a prefix tree at once (``rescoring.packing.PrefixTree``).

        memory: (S, T', D); memory_mask: (S, 1, T') bool; tokens: (S, N) int64, the token of
        each tree node (the root is sos); positions: (S, N) or (N,) int64, each node's depth;
        tree_mask: (S, N, N) bool, True where node i may attend node j (j is i or one of its
        ancestors). Returns log-probs (S, N, V): row i predicts the token after node i's
        prefix. A node's output depends only on its prefix, exactly as position i of a
        hypothesis under the causal mask, so each shared prefix is decoded once. (``forward``
        is the special case of padded chains: a causal mask and positions 0..L-1.)
        """
        tree_mask, memory_mask = self.tree_attention_masks(tree_mask, memory_mask)
        return self.forward_prepared_tree(memory, memory_mask, tokens, positions, tree_mask, memory_rows)

    def tree_attention_masks(self, tree_mask: Tensor, memory_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``tree_mask`` (S, N, N) and ``memory_mask`` (S, 1, T') bool as every layer's attention
        takes them, prepared once per call (``MultiHeadedAttention.kernel_mask``): additive float
        biases where the fused kernel runs and every query keeps a key, else unchanged."""
        if not len(self.decoders):
            return tree_mask, memory_mask
        embedding = self.embed[0]
        assert isinstance(embedding, nn.Embedding)
        dtype = embedding.weight.dtype  # the layers' inputs'
        layer = self._layer(0)
        return layer.self_attn.kernel_mask(tree_mask, dtype), layer.src_attn.kernel_mask(memory_mask, dtype)

    def forward_prepared_tree(
        self,
        memory: Tensor,
        memory_mask: Tensor,
        tokens: Tensor,
        positions: Tensor,
        tree_mask: Tensor,
        memory_rows: Tensor | None = None,
    ) -> Tensor:
        """``forward_prefix_tree`` with the masks already prepared (:meth:`tree_attention_masks`).

        Python reads no tensor's value here, and every size comes from the inputs' shapes, so a
        trace of it holds for any (S, N, T') (``asr_core.backends.traced_decoder``)."""
        embedding: nn.Module = self.embed[0]
        pos_enc = self.embed[1]
        assert isinstance(pos_enc, PositionalEncoding)
        x = pos_enc(embedding(tokens), positions)  # (S, N, D)
        for layer in self.decoders:
            x = layer(x, tree_mask, memory, memory_mask, memory_rows)
        if self.normalize_before:
            x = self.after_norm(x)
        return log_softmax_over_logits(self.output_layer(x))  # (S, N, V)

    def memory_keys_values(self, memory: Tensor) -> MemoryKeysValues:
        """Every layer's source-attention keys and values of ``memory`` (S, T', D), for :meth:`step`."""
        return [self._layer(i).src_attn.memory_keys_values(memory) for i in range(len(self.decoders))]

    def _layer(self, index: int) -> DecoderLayer:
        layer = self.decoders[index]
        assert isinstance(layer, DecoderLayer)
        return layer

    def step(
        self,
        memory_kv: MemoryKeysValues,
        memory_mask: Tensor,
        tokens: Tensor,
        cache: list[Tensor] | None,
        memory_rows: Tensor,
    ) -> tuple[Tensor, list[Tensor]]:
        """One step of autoregressive decoding, computing only the newest position.

        memory_kv: :meth:`memory_keys_values` of the memory (S rows); memory_mask: (S, 1, T')
        bool; tokens: (N,) int64, each row's newest token (sos at the first step); cache: None
        at the first step, else the cache this method returned one step earlier, its rows
        gathered by the caller to follow each row's parent; memory_rows: (N,) the memory row
        of each target row. Returns (log-probs (N, V) of the next token, the new cache: per
        layer, the self-attention's keys and values (N, H, L, d_k) of every position so far,
        keys then values; rows on dim 0, positions on dim 2). Each row's log-probs equal
        ``forward``'s last position on the same prefix. A step projects only the newest
        position: earlier positions' keys and values come from the cache.
        """
        embedding: nn.Module = self.embed[0]
        pos_enc = self.embed[1]
        assert isinstance(pos_enc, PositionalEncoding)
        position = 0 if cache is None else cache[0].size(2)
        x = pos_enc(embedding(tokens.unsqueeze(1)), torch.tensor([position], device=tokens.device))  # (N, 1, D)
        packing = RowPacking.of(memory_rows, memory_mask.size(0))  # once for every layer
        new_cache: list[Tensor] = []
        for i in range(len(self.decoders)):
            layer_cache = None if cache is None else (cache[2 * i], cache[2 * i + 1])
            x, keys_values = self._layer(i).forward_step(x, layer_cache, *memory_kv[i], memory_mask, packing)
            new_cache += keys_values
        if self.normalize_before:
            x = self.after_norm(x)
        return log_softmax_over_logits(self.output_layer(x[:, 0])), new_cache

    def forward_tree(self, memory: Tensor, mask: Tensor, tree: Tree, r_tree: Tree | None) -> tuple[Tensor, Tensor]:
        """As ``BiTransformerDecoder.forward_tree``; a unidirectional decoder ignores ``r_tree``."""
        l2r = self.forward_prefix_tree(memory, mask, *tree)
        return l2r, l2r.new_zeros(0)


def log_softmax_over_logits(logits: Tensor) -> Tensor:
    """``log_softmax(logits, -1)``, written over ``logits`` on a CPU outside autograd and export.

    A rescoring call's logits are positions x vocabulary floats (17 MB at 1,024 positions of
    4,233 units); normalizing them in place is bit for bit the same (each row is read before it
    is written) and saves writing a second such tensor into fresh memory: 5.3 -> 3.4 ms for
    those 17 MB on one thread. The decoder's search steps use it too. The caller gives up
    ``logits``.
    """
    if logits.device.type != "cpu" or torch.is_grad_enabled() or exporting():
        return torch.log_softmax(logits, dim=-1)
    return torch._log_softmax(logits, -1, False, out=logits)


class BiTransformerDecoder(nn.Module):
    """U2++: ``left_decoder`` (left-to-right) and ``right_decoder`` (right-to-left)."""

    def __init__(self, vocab_size: int, d_model: int, conf: DecoderConfig) -> None:
        super().__init__()
        self.left_decoder = TransformerDecoder(vocab_size, d_model, conf, conf.num_blocks)
        self.right_decoder = TransformerDecoder(vocab_size, d_model, conf, conf.r_num_blocks)

    def forward(
        self,
        memory: Tensor,
        memory_mask: Tensor,
        ys_in_pad: Tensor,
        ys_in_lens: Tensor,
        r_ys_in_pad: Tensor,
        reverse_weight: float = 0.0,
        memory_rows: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """r_ys_in_pad: (N, L) sos + reversed tokens, eos padding.

        Returns (l2r log-probs (N, L, V), r2l log-probs (N, L, V); empty if reverse_weight is 0).
        """
        l2r, empty = self.left_decoder(memory, memory_mask, ys_in_pad, ys_in_lens, memory_rows=memory_rows)
        if reverse_weight <= 0.0:
            return l2r, empty
        r2l, _ = self.right_decoder(memory, memory_mask, r_ys_in_pad, ys_in_lens, memory_rows=memory_rows)
        return l2r, r2l

    def memory_keys_values(self, memory: Tensor) -> MemoryKeysValues:
        """The left-to-right decoder's (autoregressive search runs left to right)."""
        return self.left_decoder.memory_keys_values(memory)

    def step(
        self, memory_kv: MemoryKeysValues, memory_mask: Tensor, tokens: Tensor, cache: list[Tensor] | None,
        memory_rows: Tensor,
    ) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
        """``TransformerDecoder.step`` of the left-to-right decoder."""
        return self.left_decoder.step(memory_kv, memory_mask, tokens, cache, memory_rows)

    def forward_tree(self, memory: Tensor, mask: Tensor, tree: Tree, r_tree: Tree | None) -> tuple[Tensor, Tensor]:
        """``TransformerDecoder.forward_prefix_tree`` of the left-to-right decoder on ``tree``
        (tokens, positions, mask) and of the right-to-left one on ``r_tree`` (the reversed
        hypotheses' tree; None: skipped, an empty tensor is returned)."""
        l2r = self.left_decoder.forward_prefix_tree(memory, mask, *tree)
        if r_tree is None:
            return l2r, l2r.new_zeros(0)
        return l2r, self.right_decoder.forward_prefix_tree(memory, mask, *r_tree)
