"""The mutant classes that once kept full marks (issue 38) lose points on every seed tried, and a
correct answer keeps them: the large-score cases are exact in float32 (no seed makes them
ill-conditioned), and no gradient check sits on clamp(min=1)'s kink."""

from __future__ import annotations

import pytest
import torch
from buggy import correct, failures, grade
from buggy.mutants import MUTANTS

from grader import cases
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

SEEDS = (7, 29, 1234567)


def _share(fn, name: str, seed: int) -> float:
    checks = [c for c in EXERCISES[name].make_checks(seed, hidden=True) if c.requires is None]
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "mutant"), MUTANTS, ids=[f"{n}-{m.__name__}" for n, m in MUTANTS])
def test_mutant_loses_points(name, mutant, seed):
    checks = [c for c in EXERCISES[name].make_checks(seed, hidden=True) if c.requires is None]
    assert failures(grade(mutant, checks)), f"{mutant.__name__} passes every check under seed {seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wrong_branch_keeps_at_most_half(seed):
    from buggy.mutants import mha_wrong_dim_unmasked

    assert _share(mha_wrong_dim_unmasked, "multi_head_attention", seed) <= 0.5


@pytest.mark.parametrize("seed", (29, *range(100, 110)))
def test_tiled_attention_full_marks_where_seed_29_failed_it(seed):
    checks = [c for c in EXERCISES["tiled_attention"].make_checks(seed, hidden=True) if c.requires is None]
    assert failures(grade(correct.tiled_attention, checks)) == {}


def _kink_as_in_torch_2_14(q, k, v, mask=None, tile=64):
    """The careful student's tiled_attention (its normaliser divided through a clamp at 1), with the
    gradient torch 2.14 gives clamp(min=1) at exactly 1 (0; torch 2.13 gives 1): a where() keeps the
    constant 1 there. A gradient check with a one-key row would fail it on one torch and not the other."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    mask = None if mask is None else mask.expand(B, H, Lq, Lk)
    x = q.float() / d**0.5
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for start in range(0, Lk, tile):
        keep = None if mask is None else mask[..., start:start + tile]
        if keep is not None and not keep.any():
            continue
        s = x @ k[:, :, start:start + tile].float().mT
        s = s if keep is None else s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)).detach()
        safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        p, alpha = torch.exp(s - safe), torch.exp(m - safe)
        total = total * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, start:start + tile].float()
        m = m_new
    return (acc / torch.where(total > 1.0, total, 1.0)).to(q.dtype)


@pytest.mark.parametrize("seed", (0, 29, 31))
def test_no_gradient_check_depends_on_the_gradient_at_a_kink(seed):
    checks = [c for c in EXERCISES["tiled_attention"].make_checks(seed, hidden=True) if c.requires is None]
    assert any(c.want_grads for c in checks)
    assert failures(grade(_kink_as_in_torch_2_14, checks)) == {}


def test_gradient_checks_give_every_nonempty_row_two_keys():
    m = torch.tensor([[True, False, False], [False, False, False], [False, False, True], [True, True, False]])
    assert cases.two_keys_or_none(m).sum(-1).tolist() == [2, 0, 2, 2]
    seen = 0
    for name in ("masked_softmax", "attention", "tiled_attention", "gqa_attention", "attention_lse"):
        for check in EXERCISES[name].make_checks(29, hidden=True):
            if not check.want_grads or check.public:
                continue
            for call in check.calls:
                for mk in (a for a in call.args if isinstance(a, torch.Tensor) and a.dtype == torch.bool):
                    seen += 1
                    assert not bool((mk.sum(-1) == 1).any()), (name, check.name)
    assert seen >= 8
