"""U2++ encoder (conformer or transformer): full-context, chunk-masked and streaming forwards.

Streaming state is passed in and returned, never stored on the module. Three streaming entry
points share one implementation:

* ``forward_chunk_batch``: many streams at once, each with its own offset and a cache whose
  frames may be in any order and partly invalid (what the engine and ``kv_ring`` use);
* ``forward_chunk``: WeNet's single-stream API with WeNet's cache layout;
* ``forward_chunk_by_chunk``: WeNet's whole-utterance streaming loop.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr_core.model.attention import MultiHeadedAttention, RelPositionMultiHeadedAttention, additive_mask
from asr_core.model.cmvn import GlobalCMVN
from asr_core.model.config import EncoderConfig
from asr_core.model.convolution import ConvolutionModule
from asr_core.model.embedding import PositionalEncoding, RelPositionalEncoding
from asr_core.model.encoder_layer import ConformerEncoderLayer
from asr_core.model.feed_forward import PositionwiseFeedForward
from asr_core.model.inference import may_cache_derived
from asr_core.model.mask import add_optional_chunk_mask, make_pad_mask
from asr_core.model.subsampling import Conv2dSubsampling

SUBSAMPLING_RATES = {"conv2d": 4, "conv2d6": 6, "conv2d8": 8}

DEFAULT_POSITION_TABLE_LIMIT = 1 << 16
"""Largest absolute encoder frame (65536 frames = 43.7 min at 25 frames/s) served from the
per-layer projected position tables; later positions are projected on the fly."""


class U2Encoder(nn.Module):
    """Conformer (``encoder: conformer``) or transformer (``encoder: transformer``) encoder.

    Shapes: B streams/utterances, T fbank frames, T' encoder frames, C encoder frames of a
    chunk, W cache frames, L blocks, H heads, D = d_model, d_k = D / H, K conv kernel.
    """

    def __init__(
        self,
        conf: EncoderConfig,
        input_dim: int,
        kind: str,
        global_cmvn: GlobalCMVN | None,
        position_table_limit: int = DEFAULT_POSITION_TABLE_LIMIT,
    ) -> None:
        super().__init__()
        d = conf.output_size
        self.conf = conf
        self.kind = kind
        self.global_cmvn = global_cmvn
        self.embed = Conv2dSubsampling(input_dim, d, SUBSAMPLING_RATES[conf.input_layer])
        self.pos_enc: PositionalEncoding = (
            RelPositionalEncoding(d, conf.positional_dropout_rate)
            if conf.pos_enc_layer_type == "rel_pos"
            else PositionalEncoding(d, conf.positional_dropout_rate)
        )
        self.normalize_before = conf.normalize_before
        self.after_norm = nn.LayerNorm(d, eps=conf.norm_eps)
        self.position_table_limit = position_table_limit
        conformer = kind == "conformer"
        self.use_cnn_module = conformer and conf.use_cnn_module
        attention_class = (
            RelPositionMultiHeadedAttention if conf.selfattention_layer_type == "rel_selfattn" else MultiHeadedAttention
        )

        def ffn() -> PositionwiseFeedForward:
            return PositionwiseFeedForward(d, conf.linear_units, conf.dropout_rate, conf.activation_type)

        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(
                d,
                attention_class(
                    conf.attention_heads,
                    d,
                    conf.attention_dropout_rate,
                    conf.query_bias,
                    conf.key_bias,
                    conf.value_bias,
                ),
                ffn(),
                ffn() if conformer and conf.macaron_style else None,
                ConvolutionModule(
                    d,
                    conf.cnn_module_kernel,
                    conf.activation_type,
                    conf.cnn_module_norm,
                    conf.causal,
                    conf.conv_bias,
                    conf.conv_norm_eps,
                )
                if self.use_cnn_module
                else None,
                conf.dropout_rate,
                conf.normalize_before,
                conf.norm_eps,
                ("norm_mha", "norm_ff") if conformer else ("norm1", "norm2"),
            )
            for _ in range(conf.num_blocks)
        )

    @property
    def output_size(self) -> int:
        return self.conf.output_size

    @property
    def num_blocks(self) -> int:
        return self.conf.num_blocks

    @property
    def heads(self) -> int:
        return self.conf.attention_heads

    @property
    def d_k(self) -> int:
        return self.conf.output_size // self.conf.attention_heads

    @property
    def cnn_cache_frames(self) -> int:
        """K - 1 for a causal conformer, 0 otherwise."""
        return self.conf.cnn_module_kernel - 1 if self.use_cnn_module and self.conf.causal else 0

    @property
    def subsampling_rate(self) -> int:
        return self.embed.subsampling_rate

    @property
    def right_context(self) -> int:
        """Extra fbank frames (beyond rate x C) a chunk of C output frames needs."""
        return self.embed.right_context

    def _uses_position_table(self) -> bool:
        """Gather rel_selfattn position terms from cached tables: only without autograd (the
        tables carry no gradient to linear_pos) and outside tracing/export/compile."""
        return self.conf.selfattention_layer_type == "rel_selfattn" and may_cache_derived(self)

    def _table_rows(self, needed: int) -> int:
        """Rows of the projected position table to use (0: project on the fly)."""
        return needed if self._uses_position_table() and needed <= self.position_table_limit else 0

    def _run_layers(
        self,
        xs: Tensor,
        mask: Tensor | None,
        key_positions: Tensor,
        table_rows: int,
        mask_pad: Tensor | None,
        att_cache: Tensor,
        cnn_cache: Tensor | None,
        glu_start: Tensor | None = None,
        cache_rows: Tensor | None = None,
        valid_frames: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """All blocks + after_norm. att_cache: (L, B, H, W, 2*d_k); cnn_cache: (L, B, D, K-1);
        with ``cache_rows`` (B,), rows of larger caches (L, S, ...) taken layer by layer;
        ``valid_frames`` (B,): real frames per row (``forward_chunk_batch``), None: all.

        Returns (ys (B, T, D), new_kv (L, B, H, T, 2*d_k), new_cnn (L, B, D, K-1)).
        """
        new_kv: list[Tensor] = []
        new_cnn: list[Tensor] = []
        for i, layer in enumerate(self.encoders):
            kv_cache, conv_cache = att_cache[i], None if cnn_cache is None else cnn_cache[i]
            if cache_rows is not None:
                kv_cache = kv_cache.index_select(0, cache_rows)
                conv_cache = None if conv_cache is None else conv_cache.index_select(0, cache_rows)
            xs, kv, cnn = layer(
                xs, mask, key_positions, table_rows, mask_pad, kv_cache, conv_cache, glu_start, valid_frames
            )
            new_kv.append(kv)
            new_cnn.append(cnn)
        if self.normalize_before:
            xs = self.after_norm(xs)
        return xs, torch.stack(new_kv), torch.stack(new_cnn)

    def forward(
        self,
        xs: Tensor,
        xs_lens: Tensor,
        decoding_chunk_size: int = 0,
        num_decoding_left_chunks: int = -1,
    ) -> tuple[Tensor, Tensor]:
        """Whole-utterance forward, optionally with WeNet's chunk attention mask.

        xs: (B, T, n_mels) raw fbank; xs_lens: (B,) int64.
        decoding_chunk_size: < 0 full context, > 0 chunk mask of that many encoder frames,
        0: dynamic chunk training in train mode, full context in eval mode.
        Returns (ys (B, T', D), masks (B, 1, T') bool, True on real frames).
        """
        masks = ~make_pad_mask(xs_lens, xs.size(1)).unsqueeze(1)  # (B, 1, T)
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        xs = self.embed(xs)  # (B, T', D)
        masks = self.embed.subsample_mask(masks)  # (B, 1, T')
        positions = torch.arange(xs.size(1), device=xs.device).unsqueeze(0)  # (1, T')
        xs = self.pos_enc(xs, positions)
        chunk_masks = add_optional_chunk_mask(
            xs,
            masks,
            self.conf.use_dynamic_chunk,
            self.conf.use_dynamic_left_chunk,
            decoding_chunk_size,
            self.conf.static_chunk_size,
            num_decoding_left_chunks,
            self.training,
            max_chunk_size=100 // self.subsampling_rate,
        )
        empty = xs.new_zeros(self.num_blocks, xs.size(0), self.heads, 0, 2 * self.d_k)
        ys, _, _ = self._run_layers(xs, chunk_masks, positions, self._table_rows(xs.size(1)), masks, empty, None)
        return ys, masks

    def forward_chunk_batch(
        self,
        xs: Tensor,
        offsets: Tensor,
        att_cache: Tensor,
        cache_pos: Tensor,
        cache_mask: Tensor,
        cnn_cache: Tensor,
        *,
        cache_is_finite: bool = False,
        max_offset: int | None = None,
        position_rows: int | None = None,
        glu_cache: bool = False,
        cache_rows: Tensor | None = None,
        valid_frames: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One chunk of B independent streams in one pass.

        xs: (B, T_in, n_mels) raw fbank (CMVN applied here); T_in = (C-1)*rate + right_context+1
            for C output frames (a shorter final chunk gives fewer).
        offsets: (B,) int64 absolute encoder-frame index of each stream's first output frame.
        att_cache: (L, B, H, W, 2*d_k) cached keys|values, frames in any order (W may be 0).
        cache_pos: (B, W) int64 absolute encoder-frame index of each cache frame.
        cache_mask: (B, W) bool, True where the cache frame is valid; invalid frames are
            ignored whatever they hold.
        cnn_cache: (L, B, D, K-1) last K-1 conv-module inputs per layer (zeros for a new stream).
        cache_is_finite: the caller guarantees att_cache holds no NaN/inf, even in invalid frames
            (a zero-initialised pool of model outputs such as ``kv_ring``): skips zeroing them,
            a copy of the whole cache.
        max_offset: ``int(offsets.max())`` when the caller knows it on the host; sizes the
            position table without a device-to-host sync.
        position_rows: use this many rows of the position table (more than any key position
            of the batch), whatever the offsets; for graphs traced once and run on any offset
            below it (``backends.traced``).
        glu_cache: cnn_cache holds each conv module's last K-1 GLU outputs instead of its
            inputs (``ConvolutionModule.forward``): the same results without recomputing the
            first pointwise conv over the cached frames. The caller keeps one layout per cache;
            zeros (a new stream, or one reset after an endpoint, at offset 0) are valid in both.
        cache_rows: (B,) int64: att_cache (L, S, H, W, 2*d_k) and cnn_cache (L, S, D, K-1) are a
            pool of S streams' caches and these rows (dim 1) are the batch's, read layer by
            layer where they lie (``kv_ring.KvPool.att``/``cnn``) instead of copied out of the
            pool for the whole step first: each layer's rows are copied just before it runs, so
            its attention reads them from the CPU's caches (docs/BENCHMARKS.md).
        valid_frames: (B,) int64, 1..C: each row's output frames that come from its real audio,
            for a short last chunk whose fbank was padded to the full shape (so that it runs
            in the full chunk's graph). The padded frames are masked out as attention keys and
            kept out of the conv cache, and the conv is causal and the subsampling reads no
            padded fbank frame for a real output frame: the real frames' outputs are those of
            the short chunk run at its own shape. The padded frames' outputs (ys, new_kv past
            ``valid_frames``) are meaningless: the caller drops them. None: all C are real.
        Returns (ys (B, C, D), new_kv (L, B, H, C, 2*d_k) keys|values of this chunk's frames
        only, new_cnn (L, B, D, K-1)).
        """
        if self.use_cnn_module and not self.conf.causal:
            raise ValueError("chunked forward needs a causal conformer (encoder_conf.causal: true)")
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        xs = self.embed(xs)  # (B, C, D)
        chunk = xs.size(1)
        chunk_pos = offsets.unsqueeze(1) + torch.arange(chunk, device=xs.device)  # (B, C)
        xs = self.pos_enc(xs, chunk_pos)
        key_positions = torch.cat((cache_pos, chunk_pos), dim=1)  # (B, W+C)
        if valid_frames is None:
            new_valid = torch.ones_like(chunk_pos, dtype=torch.bool)
        else:
            new_valid = torch.arange(chunk, device=xs.device).unsqueeze(0) < valid_frames.unsqueeze(1)  # (B, C)
        key_mask = torch.cat((cache_mask, new_valid), dim=1).unsqueeze(1)  # (B, 1, W+C)
        # Every row keeps its first new frame, so no query loses all its keys, and the mask can
        # be the additive bias the attention's softmax takes (MultiHeadedAttention.attend),
        # built once here instead of filled into the scores and the weights in every block.
        key_bias = additive_mask(key_mask, xs.dtype)
        if not cache_is_finite:
            if cache_rows is not None:
                att_cache, cnn_cache = att_cache.index_select(1, cache_rows), cnn_cache.index_select(1, cache_rows)
                cache_rows = None
            # Invalid cache frames may hold anything (even NaN); zero them so 0 * value stays 0.
            att_cache = att_cache.masked_fill(~cache_mask[None, :, None, :, None], 0.0)
        table_rows = 0
        if position_rows is not None:
            table_rows = self._table_rows(position_rows)
        elif self._uses_position_table():
            if max_offset is None:
                max_offset = int(offsets.max()) if offsets.numel() else 0
            table_rows = self._table_rows(max_offset + chunk)
        glu_start = None
        if glu_cache and self.cnn_cache_frames > 0:
            # Cache frame j of a stream at offset o is frame o - (K-1) + j: before the start if < 0.
            history = torch.arange(self.cnn_cache_frames, device=xs.device) - self.cnn_cache_frames
            glu_start = (offsets.unsqueeze(1) + history) < 0  # (B, K-1)
        return self._run_layers(
            xs,
            key_bias,
            key_positions,
            table_rows,
            None,
            att_cache,
            cnn_cache if self.cnn_cache_frames > 0 else None,
            glu_start,
            cache_rows,
            valid_frames,
        )

    def forward_chunk(
        self,
        xs: Tensor,
        offset: int,
        required_cache_size: int,
        att_cache: Tensor | None = None,
        cnn_cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """WeNet's single-stream chunk forward (same semantics and cache layout).

        xs: (1, T_in, n_mels) raw fbank; offset: encoder frames already emitted;
        required_cache_size: cache frames to keep (< 0 all, 0 none);
        att_cache: (L, H, cache_t, 2*d_k) or empty (0, 0, 0, 0)/None before the first chunk;
        cnn_cache: (L, 1, D, K-1) or empty/None.
        Returns (ys (1, C, D), att_cache (L, H, cache_t', 2*d_k), cnn_cache (L, 1, D, K-1)).
        """
        if xs.size(0) != 1:
            raise ValueError(f"forward_chunk takes one stream, got batch {xs.size(0)}")
        dev = xs.device
        if att_cache is None or att_cache.size(0) == 0:
            att_cache = xs.new_zeros(self.num_blocks, self.heads, 0, 2 * self.d_k)
        if cnn_cache is None or cnn_cache.size(0) == 0:
            cnn_cache = xs.new_zeros(self.num_blocks, 1, self.output_size, self.cnn_cache_frames)
        cache_t = att_cache.size(2)
        cache_pos = (offset - cache_t + torch.arange(cache_t, device=dev)).unsqueeze(0)  # (1, W)
        cache_mask = torch.ones(1, cache_t, dtype=torch.bool, device=dev)
        offsets = torch.tensor([offset], dtype=torch.int64, device=dev)
        ys, new_kv, new_cnn = self.forward_chunk_batch(
            xs, offsets, att_cache.unsqueeze(1), cache_pos, cache_mask, cnn_cache
        )
        full = torch.cat((att_cache, new_kv[:, 0]), dim=2)  # (L, H, cache_t + C, 2*d_k)
        keys = full.size(2)
        if required_cache_size < 0:
            start = 0
        elif required_cache_size == 0:
            start = keys
        else:
            start = max(keys - required_cache_size, 0)
        return ys, full[:, :, start:], new_cnn

    def chunk_windows(self, num_frames: int, chunk: int) -> list[tuple[int, int]]:
        """[start, end) fbank frame windows of WeNet's streaming loop for C = ``chunk``.

        Windows are (C-1)*rate + right_context+1 frames long, advance by rate*C (overlapping by
        right_context+1-rate frames) and the last one may be shorter (fewer output frames).
        """
        if chunk <= 0:
            raise ValueError(f"decoding_chunk_size must be > 0, got {chunk}")
        rate = self.subsampling_rate
        context = self.right_context + 1
        window = (chunk - 1) * rate + context
        return [(start, min(start + window, num_frames)) for start in range(0, num_frames - context + 1, rate * chunk)]

    def forward_chunk_by_chunk(
        self, xs: Tensor, decoding_chunk_size: int, num_decoding_left_chunks: int = -1
    ) -> tuple[Tensor, Tensor]:
        """WeNet's streaming loop over a whole utterance.

        xs: (1, T, n_mels). Chunk k reads fbank frames [k*rate*C, k*rate*C + (C-1)*rate + rc + 1)
        (clipped to T). Returns (ys (1, T', D), masks (1, 1, T') all True).
        """
        required_cache_size = decoding_chunk_size * num_decoding_left_chunks
        att_cache: Tensor | None = None
        cnn_cache: Tensor | None = None
        outputs: list[Tensor] = []
        offset = 0
        for start, end in self.chunk_windows(xs.size(1), decoding_chunk_size):
            ys, att_cache, cnn_cache = self.forward_chunk(
                xs[:, start:end], offset, required_cache_size, att_cache, cnn_cache
            )
            outputs.append(ys)
            offset += ys.size(1)
        ys = torch.cat(outputs, dim=1)
        return ys, torch.ones(1, 1, ys.size(1), dtype=torch.bool, device=ys.device)
