"""Beam search with the left-to-right attention decoder, batched over utterances.

WeNet's "attention" decoding mode: the decoder itself proposes transcripts, one token at a
time, attending to the whole utterance's encoder output. The finals (``asr_core.finals``)
add these proposals to the CTC n-best before attention rescoring. On a model whose CTC head is
weaker than its decoder, the right answer is often missing from the CTC n-best, and no
rescoring can then pick it.

All utterances' live hypotheses are rows of one decoder call per step, each row attending to
its utterance's memory row. A step computes only the newest position (``TransformerDecoder.step``
keeps every earlier position's self-attention keys and values), and the memory is projected
once per layer for the whole search.

Scores are sums of the decoder's log-probabilities, eos included; no length normalization
(WeNet's). An utterance's search ends when it holds ``beam`` ended hypotheses and none of its
live ones can still beat the best of them (log-probabilities only lower a score), when no live
hypothesis is left, or after ``max_tokens`` tokens, where the live ones end as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from rescoring.packing import padded_memory

__all__ = ["AttentionHypothesis", "StepDecoder", "attention_beam_search", "supports_search"]


@runtime_checkable
class StepDecoder(Protocol):
    """A decoder with an incremental step (``asr_core.model.decoder``'s decoders)."""

    def memory_keys_values(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def step(
        self,
        memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor,
        tokens: torch.Tensor,
        cache: list[torch.Tensor] | None,
        memory_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]: ...


@dataclass(frozen=True, slots=True)
class AttentionHypothesis:
    tokens: tuple[int, ...]
    score: float  # sum of the left-to-right decoder's log-probabilities, eos included


def supports_search(decoder: object) -> bool:
    """Whether ``decoder`` has the incremental step this search needs (``StepDecoder``'s members)."""
    return isinstance(decoder, StepDecoder)


@torch.inference_mode()
def attention_beam_search(
    decoder: StepDecoder,
    encoder_outs: Sequence[torch.Tensor],
    beam: int,
    *,
    sos: int,
    eos: int,
    max_tokens: Sequence[int] | None = None,
) -> list[list[AttentionHypothesis]]:
    """Up to ``beam`` hypotheses per utterance, best first.

    Args:
        decoder: see :class:`StepDecoder`.
        encoder_outs: S tensors (T_s, D), on the decoder's device and dtype.
        beam: hypotheses kept per utterance and step.
        sos, eos: the decoder's start and end ids.
        max_tokens: per utterance, the most tokens a hypothesis may have; default T_s (CTC
            cannot emit more tokens than frames either). An utterance allowed 0 tokens, or
            with no frames, gets no hypotheses.
    """
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    count = len(encoder_outs)
    if count == 0:
        return []
    limits = [int(e.shape[0]) for e in encoder_outs] if max_tokens is None else [int(m) for m in max_tokens]
    if len(limits) != count:
        raise ValueError(f"{count} encoder outputs but {len(limits)} token limits")
    memory, memory_mask = padded_memory(encoder_outs)
    device = memory.device
    memory_kv = decoder.memory_keys_values(memory)
    ended: list[list[AttentionHypothesis]] = [[] for _ in range(count)]
    # Live rows, grouped by utterance in utterance order; parallel lists and tensors. An
    # utterance allowed no tokens (or without frames) gets no proposals.
    row_stream = [s for s in range(count) if limits[s] >= 1 and encoder_outs[s].shape[0] > 0]
    row_tokens: list[tuple[int, ...]] = [() for _ in row_stream]
    row_scores = torch.zeros(len(row_stream), dtype=torch.float64)
    newest = torch.full((len(row_stream),), sos, dtype=torch.long, device=device)
    cache: list[torch.Tensor] | None = None
    step = 0
    while row_stream:
        rows_t = torch.tensor(row_stream, dtype=torch.long, device=device)
        log_probs, cache = decoder.step(memory_kv, memory_mask, newest, cache, rows_t)
        # Each row's best `beam` continuations hold its utterance's best `beam`; an utterance's
        # rows then form one line of beam x beam candidates (-inf pads), ranked once more. A
        # row's score adds the same to all its continuations, so it joins after the row's topk.
        row_top = log_probs.topk(min(beam, log_probs.shape[1]), dim=1)
        row_values = row_scores[:, None] + row_top.values.cpu().double()
        width = row_values.shape[1]
        streams = sorted(set(row_stream))
        line_of = {s: i for i, s in enumerate(streams)}
        slot = [0] * len(row_stream)
        used: dict[int, int] = {}
        for r, s in enumerate(row_stream):
            slot[r] = used.get(s, 0)
            used[s] = slot[r] + 1
        lines = torch.full((len(streams), beam, width), -float("inf"), dtype=torch.float64)
        lines[[line_of[s] for s in row_stream], slot] = row_values
        tokens_at = torch.zeros((len(streams), beam, width), dtype=torch.long)
        tokens_at[[line_of[s] for s in row_stream], slot] = row_top.indices.cpu()
        top = lines.view(len(streams), beam * width).topk(min(beam, beam * width), dim=1)
        top_tokens = tokens_at.view(len(streams), beam * width).gather(1, top.indices)
        row_at = {(s, slot[r]): r for r, s in enumerate(row_stream)}
        step += 1
        next_stream: list[int] = []
        next_tokens: list[tuple[int, ...]] = []
        next_scores: list[float] = []
        parents: list[int] = []
        next_newest: list[int] = []
        for line, s in enumerate(streams):
            live: list[tuple[int, int, float]] = []
            candidates = zip(
                top.values[line].tolist(), top.indices[line].tolist(), top_tokens[line].tolist(), strict=True
            )
            for value, index, token in candidates:
                if value == -float("inf"):
                    break
                parent = row_at[(s, index // width)]
                if token == eos:
                    ended[s].append(AttentionHypothesis(row_tokens[parent], value))
                else:
                    live.append((parent, token, value))
            best_ended = max((h.score for h in ended[s]), default=-float("inf"))
            if not live or (len(ended[s]) >= beam and best_ended >= live[0][2]):
                continue
            if step >= limits[s]:  # the token just chosen is the last one allowed
                ended[s].extend(AttentionHypothesis(row_tokens[p] + (t,), v) for p, t, v in live)
                continue
            for parent, token, value in live:
                next_stream.append(s)
                next_tokens.append(row_tokens[parent] + (token,))
                next_scores.append(value)
                parents.append(parent)
                next_newest.append(token)
        if not next_stream:
            break
        index = torch.tensor(parents, dtype=torch.long, device=device)
        cache = [c.index_select(0, index) for c in cache]
        row_stream, row_tokens = next_stream, next_tokens
        row_scores = torch.tensor(next_scores, dtype=torch.float64)
        newest = torch.tensor(next_newest, dtype=torch.long, device=device)
    return [sorted(hyps, key=lambda h: -h.score)[:beam] for hyps in ended]
