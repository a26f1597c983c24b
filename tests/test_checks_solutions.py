"""Correct solutions pass every check; a stub fails every check."""

from __future__ import annotations

import pytest
import torch
from buggy import correct, failures, grade, native

from grader.checks import EXERCISES


@pytest.mark.parametrize("name", list(EXERCISES))
@pytest.mark.parametrize("solution, seed", [(correct, 0), (correct, 11), (native, 5)],
                         ids=["correct-0", "correct-11", "native-5"])
def test_correct_solutions_pass_every_check(name, solution, seed):
    verdicts = grade(getattr(solution, name), EXERCISES[name].make_checks(seed, hidden=True))
    assert verdicts, "no checks ran"
    assert failures(verdicts) == {}


def _stub(*args, **kwargs):
    raise NotImplementedError("exercise: fill this in")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_stub_fails_every_check_and_says_so(name):
    verdicts = grade(_stub, EXERCISES[name].make_checks(3, hidden=True))
    assert verdicts
    for check, v in verdicts.items():
        assert not v.passed, check
        assert "not implemented yet" in v.message, (check, v.message)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(EXERCISES))
def test_cuda_checks_pass_for_correct_solution(name):
    checks = [c for c in EXERCISES[name].make_checks(0) if c.requires == "cuda"]
    assert checks, "every exercise has a CUDA check"
    assert failures(grade(getattr(correct, name), checks)) == {}
