"""Chapter 13's checks hold the kernels to the chapter: the course's kernels pass, each classic
mistake fails with its diagnosis, shortcuts (PyTorch in the launcher, constant outputs) lose more
than half the points. In Triton's CPU interpreter; skipped where triton is not installed."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU tensors, no GPU
pytest.importorskip("triton")

from buggy import failures, grade  # noqa: E402
from buggy import kernels as bad  # noqa: E402

from attnmask.kernels import block_sparse_backward, block_sparse_forward  # noqa: E402
from grader.checks import EXERCISES  # noqa: E402
from grader.checks.ch8_speed.backward import MISTAKES8  # noqa: E402
from grader.checks.ch13_kernels import MISTAKES13  # noqa: E402
from grader.mistakes import MISTAKES  # noqa: E402
from grader.results import CheckResult, score_of  # noqa: E402

NAMED = {**MISTAKES, **MISTAKES8, **MISTAKES13}
SEED = 7


def _score(name, fn, seed=SEED):
    checks = EXERCISES[name].make_checks(seed, hidden=True)
    verdicts = grade(fn, checks)
    results = [CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
               for c in checks if c.name in verdicts]  # CUDA checks run where there is a GPU
    return score_of(results), verdicts


@pytest.mark.parametrize("name, fn", [("block_sparse_forward", block_sparse_forward),
                                      ("block_sparse_backward", block_sparse_backward)])
@pytest.mark.parametrize("seed", [0, SEED])
def test_course_kernels_pass_every_check(name, fn, seed):
    score, verdicts = _score(name, fn, seed)
    assert score == 1.0, failures(verdicts)


@pytest.mark.parametrize("fn, says", bad.FORWARD_BUGS + bad.BACKWARD_BUGS,
                         ids=[fn.__name__ for fn, _ in bad.FORWARD_BUGS + bad.BACKWARD_BUGS])
def test_mistake_fails_with_its_diagnosis(fn, says):
    name = "block_sparse_forward" if fn.__name__.startswith("fwd") else "block_sparse_backward"
    score, verdicts = _score(name, fn)
    failed = failures(verdicts)
    assert failed, f"{fn.__name__} passes every check"
    said = [n for n, message in failed.items() if NAMED[says] in message]
    assert said, f"no failing check says {says!r}; they say:\n" + "\n".join(
        f"  {n}: {m.splitlines()[0]}" for n, m in failed.items())


def test_every_chapter13_mistake_has_a_buggy_kernel():
    assert set(MISTAKES13) - {s for _, s in bad.FORWARD_BUGS + bad.BACKWARD_BUGS} == {"k_torch_launcher"}


@pytest.mark.parametrize("name, fn", [("block_sparse_forward", bad.fwd_torch_launcher),
                                      ("block_sparse_backward", bad.bwd_torch_launcher)])
def test_attention_in_the_launcher_loses_more_than_half(name, fn):
    score, verdicts = _score(name, fn)
    assert score < 0.5, failures(verdicts)
    assert any(MISTAKES13["k_torch_launcher"] in m for m in failures(verdicts).values())


@pytest.mark.parametrize("name, fn", [("block_sparse_forward", bad.fwd_zeros),
                                      ("block_sparse_backward", bad.bwd_zeros)])
def test_constant_outputs_score_zero(name, fn):
    score, _ = _score(name, fn)
    assert score == 0.0
