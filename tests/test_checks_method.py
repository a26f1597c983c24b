"""Checks of the method (issue 45): right numbers by a method the statement rules out lose more
than half of the exercise's points, and the course's answers keep them all.

The shortcuts (tests/buggy/tiled.py, tests/buggy/parallel.py): a forward or backward that holds the
whole score or weight matrix (built whole, kept tile by tile, or kept by autograd), a backward that
recomputes the lse and out instead of following the given ones (a forward of its own, autograd,
torch.func.vjp), a ring whose out and lse come from one pass over all keys beside correct steps, and a
cascade that reads the prefix once per sequence, and a capstone whose gradients come from autograd
(no Function, or a Function whose backward is autograd) or from weights saved whole."""

from __future__ import annotations

import pytest
import torch
from buggy import correct, grade
from buggy import parallel as pl
from buggy import tiled as tl

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of
from grader.sandbox.execute import execute
from grader.spec import Call

SEEDS = (0, 7)


def share(fn, name: str, seed: int) -> float:
    """The share of ``name``'s points that ``fn`` earns under ``seed`` (CUDA checks skipped here)."""
    checks = [c for c in EXERCISES[name].make_checks(seed, hidden=True) if c.requires is None]
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks])


SHORTCUTS = [
    ("tiled_attention", tl.tiled_full_scores),
    ("tiled_attention", tl.tiled_one_tile),
    ("tiled_attention", tl.tiled_keeps_tiles),
    ("tiled_attention_backward", tl.backward_autograd),
    ("tiled_attention_backward", tl.backward_keeps_weights),
    ("tiled_attention_backward", tl.backward_autograd_tiled),
    ("tiled_attention_backward", tl.backward_vjp),
    ("tiled_attention_backward", tl.backward_recomputes_lse),
    ("tiled_attention_backward", tl.backward_recomputes_lse_tiled),
    ("ring_attention", pl.ring_att_one_pass),
    ("ring_attention", pl.ring_att_steps_then_one_pass),
    ("ring_attention", pl.ring_att_steps_then_causal_sdpa_like),
    ("ring_attention", pl.ring_att_rank_over_all_keys),
    ("tiled_attention_fn", tl.fn_no_function),
    ("tiled_attention_fn", tl.fn_backward_by_autograd),
    ("tiled_attention_fn", tl.fn_saves_weights),
    ("cascade_attention", pl.cascade_per_sequence),
    ("cascade_attention", pl.cascade_recompute),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "fn"), SHORTCUTS, ids=[f"{n}-{f.__name__}" for n, f in SHORTCUTS])
def test_a_shortcut_loses_more_than_half(name, fn, seed):
    assert share(fn, name, seed) < 0.5


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["tiled_attention", "tiled_attention_backward", "tiled_attention_fn",
                                  "ring_attention", "cascade_attention"])
def test_the_course_answers_keep_every_point(name, seed):
    assert share(getattr(correct, name), name, seed) == 1.0
    assert share(getattr(am, name), name, seed) == 1.0


def test_the_live_record_counts_what_is_alive_not_what_was_made():
    """Ten (64, 64) tensors made and dropped one after the other peak at about one; ten kept, at ten."""
    def dropped():
        for _ in range(10):
            t = torch.ones(64, 64) * 2.0
            del t
        return torch.zeros(1)

    def kept():
        return [torch.ones(64, 64) * 2.0 for _ in range(10)]

    small, large = (execute(fn, Call((), allocations=True)).peak for fn in (dropped, kept))
    assert 64 * 64 <= small < 3 * 64 * 64
    assert large >= 10 * 64 * 64


def test_the_live_record_sees_what_autograd_keeps_for_its_backward():
    q, k, v = (torch.randn(1, 2, 64, 2) for _ in range(3))
    mask = torch.rand(1, 2, 64, 64) < 0.8
    out, lse = am.attention_lse(q, k, v, mask)
    d_out = torch.randn_like(out)
    call = Call((q, k, v, out, lse, d_out, mask, 4), allocations=True)
    tiled, autograd = execute(am.tiled_attention_backward, call), execute(tl.backward_autograd_tiled, call)
    assert tiled.peak < 2 * 64 * 64 <= autograd.peak


def test_the_reference_backward_follows_the_given_lse_and_out():
    """With an lse and an out that no forward gives, the reference is the formulas applied to them
    (P = exp(S - lse), D = rowsum(d_out * out)), and autograd through attention is not."""
    from grader.checks.ch8_speed.backward import given

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(1, 2, 5, 5, generator=gen) < 0.7
    mask[..., 0] = True
    q, k, v, out, lse, d_out, mask = given(gen, q, k, v, mask)
    s = (q @ k.mT / 2.0).masked_fill(~mask, float("-inf"))
    p = torch.exp(s - lse[..., None])
    ds = p * (d_out @ v.mT - (d_out * out).sum(-1, keepdim=True))
    want = (ds @ k / 2.0, ds.mT @ q / 2.0, p.mT @ d_out)
    got = am.tiled_attention_backward(q, k, v, out, lse, d_out, mask, 2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    autograd = tl.backward_autograd(q, k, v, out, lse, d_out, mask, 2)
    assert not all(torch.allclose(a, w) for a, w in zip(autograd, want))
