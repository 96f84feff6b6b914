"""Sharing output rows by pronunciation: groups from pinyin, the parametrization's identity at the
start, gradient reaching a rare character through its syllable, and plain export."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recipes import tying

UNITS = ["<blank>", "<unk>", "妈", "马", "吗", "码", "井", "<sos/eos>"]


def test_groups_follow_pinyin() -> None:
    base, tonal = tying.pronunciation_groups(UNITS)
    mother, horse, question, code, well = 2, 3, 4, 5, 6
    assert len({int(base[i]) for i in (mother, horse, question, code)}) == 1  # all "ma"
    assert int(tonal[horse]) == int(tonal[code])  # ma3
    assert len({int(tonal[i]) for i in (mother, horse, question)}) == 3  # ma1, ma3, ma5
    assert int(base[well]) != int(base[mother])
    specials = [0, 1, 7]
    assert len({int(base[i]) for i in specials}) == 3 and len({int(tonal[i]) for i in specials}) == 3


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ctc_lo = nn.Linear(4, len(UNITS))


def test_tying_keeps_the_function_and_shares_gradients() -> None:
    torch.manual_seed(0)
    head = Head()
    before = head.ctc_lo.weight.detach().clone(), head.ctc_lo.bias.detach().clone()
    assert tying.tie_by_pronunciation(head, UNITS) == 2
    assert torch.allclose(head.ctc_lo.weight, before[0], atol=1e-6)
    assert torch.allclose(head.ctc_lo.bias, before[1], atol=1e-6)

    # train only on 马 (ma3): 码 (also ma3) moves with it, 妈 (ma1) a little (shared "ma"), 井 not at all
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    x = torch.randn(32, 4)
    for _ in range(20):
        loss = nn.functional.cross_entropy(head.ctc_lo(x), torch.full((32,), 3))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    moved = (head.ctc_lo.bias.detach() - before[1]).tolist()
    assert moved[5] > 0.0  # 码 rose with 马 although never a target
    assert moved[6] < 0.0  # 井 only ever pushed down
    assert moved[3] > moved[5] > moved[6]

    plain = tying.plain_state_dict(head)
    assert sorted(plain) == ["ctc_lo.bias", "ctc_lo.weight"]
    assert torch.allclose(plain["ctc_lo.weight"], head.ctc_lo.weight)


def test_rejects_a_mismatched_vocabulary() -> None:
    with pytest.raises(ValueError, match="8 units"):
        tying.tie_by_pronunciation(_five(), UNITS)


def _five() -> nn.Module:
    holder = nn.Module()
    holder.ctc_lo = nn.Linear(4, 5)
    return holder


def test_syllable_ctc_scores_syllables_with_the_shared_rows() -> None:
    torch.manual_seed(0)
    head = Head()
    with pytest.raises(ValueError, match="tie_by_pronunciation"):
        tying.SyllableCTC(head.ctc_lo)
    tying.tie_by_pronunciation(head, UNITS)
    syllables = tying.SyllableCTC(head.ctc_lo)
    hs = torch.randn(2, 6, 4)
    targets = torch.tensor([[3, 5, -1], [2, 6, 4]])  # 马码 and 妈井吗
    loss = syllables(hs, torch.tensor([6, 6]), targets, torch.tensor([2, 3]))
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    tables = head.ctc_lo.parametrizations["weight"][0].tables
    assert tables[0].grad is not None and tables[1].grad is not None and tables[1].grad.abs().sum() > 0
    # 马 and 码 are one syllable (ma3): the targets 马码 and 码马 give the same loss
    swapped = syllables(hs, torch.tensor([6, 6]), torch.tensor([[5, 3, -1], [2, 6, 4]]), torch.tensor([2, 3]))
    assert torch.allclose(loss, swapped)
    assert head.ctc_lo.parametrizations["weight"].original.grad is None  # residuals are the character head's own
