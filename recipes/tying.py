"""Output layers shared by pronunciation while training: rare characters learn from their homophones.

With character units, a character seen a few dozen times in training never gets its own row of
the CTC and decoder output layers right: on the first demo model, characters seen fewer than 50
times were never recognised, those seen 200+ times 61 % of the time. Our speech is read from
tone-numbered pinyin, so every character of one syllable sounds alike. During training each
row of a tied matrix (CTC ``ctc_lo``, the decoders' ``output_layer`` and ``embed``) is

    W[c] = T_base[base(c)] + T_tone[tonal(c)] + D[c]

where ``base`` is the toneless syllable (``ma``), ``tonal`` the syllable with its tone (``ma3``),
and ``D`` a per-character residual. Every occurrence of any ``ma3`` character trains ``T_tone``,
so a rare character starts out as good as its syllable and its residual only has to tell it
apart from its homophones. The sum is a ``torch.nn.utils.parametrize`` parametrization;
:func:`plain_state_dict` materialises it, so exported models are ordinary WeNet state dicts with
the usual shapes and nothing of this module is needed at inference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pypinyin import Style, pinyin
from torch import nn
from torch.nn.utils import parametrize


def pronunciation_groups(units: Sequence[str]) -> list[torch.Tensor]:
    """Two (V,) int64 group ids per unit: toneless syllable, then tonal syllable.

    A unit that is not a single Chinese character (``<blank>``, ``<unk>``, ``<sos/eos>``) is a
    group of its own at both levels. A polyphonic character takes its most common reading.
    """
    levels: list[dict[str, int]] = [{}, {}]
    ids: list[list[int]] = [[], []]
    for unit in units:
        reading = pinyin(unit, style=Style.TONE3, neutral_tone_with_five=True)[0][0] if len(unit) == 1 else ""
        if reading[-1:].isdigit():
            keys = (reading.rstrip("0123456789"), reading)
        else:
            keys = (f"unit:{unit}", f"unit:{unit}")
        for level, key in enumerate(keys):
            ids[level].append(levels[level].setdefault(key, len(levels[level])))
    return [torch.tensor(i, dtype=torch.long) for i in ids]


class GroupSum(nn.Module):
    """Parametrization ``W = D + sum_k table_k[group_k]`` over the first dimension of ``W``."""

    def __init__(self, groups: Sequence[torch.Tensor], shape: torch.Size) -> None:
        super().__init__()
        for k, g in enumerate(groups):
            if g.shape != (shape[0],):
                raise ValueError(f"group ids have shape {tuple(g.shape)}, the tied tensor has {shape[0]} rows")
            self.register_buffer(f"groups{k}", g.clone(), persistent=True)
        self.tables = nn.ParameterList(nn.Parameter(torch.zeros(int(g.max()) + 1, *shape[1:])) for g in groups)

    def _groups(self) -> list[torch.Tensor]:
        return [getattr(self, f"groups{k}") for k in range(len(self.tables))]

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        out = residual
        for table, g in zip(self.tables, self._groups(), strict=True):
            out = out + table[g]
        return out

    @torch.no_grad()
    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """Start each table at its groups' mean of what the coarser levels leave; return the residual."""
        residual = weight.detach().clone()
        for table, g in zip(self.tables, self._groups(), strict=True):
            counts = torch.bincount(g, minlength=table.shape[0]).clamp(min=1).to(weight.dtype)
            sums = torch.zeros_like(table).index_add_(0, g, residual)
            table.copy_(sums / counts.view(-1, *([1] * (weight.dim() - 1))))
            residual -= table[g]
        return residual


def tied_tensors(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, tensor name) of every vocabulary-indexed tensor: CTC and decoder output layers, decoder embeddings."""
    targets: list[tuple[nn.Module, str]] = []
    for name, module in model.named_modules():
        if name.endswith("ctc_lo") or name.endswith("output_layer"):
            targets += [(module, "weight"), (module, "bias")]
        elif isinstance(module, nn.Embedding) and "decoder" in name:
            targets.append((module, "weight"))
    return targets


def tie_by_pronunciation(model: nn.Module, units: Sequence[str]) -> int:
    """Parametrize the model's vocabulary-indexed tensors (function unchanged); returns how many."""
    groups = pronunciation_groups(units)
    targets = tied_tensors(model)
    for module, name in targets:
        tensor = getattr(module, name)
        if tensor.shape[0] != len(units):
            raise ValueError(f"{type(module).__name__}.{name} has {tensor.shape[0]} rows for {len(units)} units")
        parametrize.register_parametrization(
            module, name, GroupSum([g.to(tensor.device) for g in groups], tensor.shape)
        )
    return len(targets)


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict an untied model of the same config has: parametrizations materialised.

    (Not by deep-copying and removing the parametrizations: the copy shares the parametrized class
    with the original, and removing a parametrization deletes the property from that class.)"""
    state = model.state_dict()
    for prefix, module in model.named_modules():
        if not parametrize.is_parametrized(module):
            continue
        dot = f"{prefix}." if prefix else ""
        for name in module.parametrizations:
            inner = f"{dot}parametrizations.{name}."
            for key in [k for k in state if k.startswith(inner)]:
                del state[key]
            state[f"{dot}{name}"] = getattr(module, name).detach().clone()
    return state


def _group_sum(module: nn.Module, name: str) -> GroupSum:
    """The GroupSum parametrizing ``module.<name>``."""
    tie = getattr(module, "parametrizations")[name][0]  # noqa: B009 (set by torch at run time)
    if not isinstance(tie, GroupSum):
        raise ValueError(f"{type(module).__name__}.{name} is not tied by pronunciation")
    return tie


class SyllableCTC(nn.Module):
    """An auxiliary CTC loss over tonal syllables whose output layer IS the CTC head's shared rows.

    Tying alone still leaves the encoder learning syllables only through a softmax over
    characters, where homophones compete and rare ones come out as blank. This head scores the
    ~1,000 tonal syllables with ``T_base[base(s)] + T_tone[s]`` (weights and biases of the tied
    ``ctc_lo``) and trains them with each transcript's syllables (the characters' tonal groups),
    so every syllable gets dense supervision and the character head, whose rows contain those
    tables, inherits it. Nothing of this is exported. Requires :func:`tie_by_pronunciation` first.
    """

    def __init__(self, ctc_lo: nn.Module, blank_id: int = 0) -> None:
        super().__init__()
        if not parametrize.is_parametrized(ctc_lo, "weight") or not parametrize.is_parametrized(ctc_lo, "bias"):
            raise ValueError("SyllableCTC needs a ctc_lo tied by pronunciation (tie_by_pronunciation)")
        self.ctc_lo = ctc_lo
        base, tonal = _group_sum(ctc_lo, "weight")._groups()
        # plain tensors on the head's device (the head is the model's; this module is never moved)
        self.unit_to_syllable = tonal.clone()
        self.syllable_base = torch.zeros(int(tonal.max()) + 1, dtype=torch.long, device=tonal.device)
        self.syllable_base[tonal] = base
        self.blank = int(tonal[blank_id])
        self.loss = nn.CTCLoss(blank=self.blank, reduction="sum", zero_infinity=True)

    def _table(self, name: str) -> torch.Tensor:
        tables = _group_sum(self.ctc_lo, name).tables
        return tables[0][self.syllable_base] + tables[1]

    def forward(
        self, hs: torch.Tensor, hlens: torch.Tensor, ys_pad: torch.Tensor, ys_lens: torch.Tensor
    ) -> torch.Tensor:
        """As ``CTC.forward`` (hs (B, T', D), character targets padded with -1) -> loss per utterance."""
        logits = nn.functional.linear(hs.float(), self._table("weight"), self._table("bias"))
        logp = torch.log_softmax(logits, dim=-1).transpose(0, 1)
        targets = self.unit_to_syllable[ys_pad.clamp(min=0)]
        return self.loss(logp, targets, hlens, ys_lens) / hs.size(0)
