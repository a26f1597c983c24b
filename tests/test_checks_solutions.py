"""Correct solutions pass every check; a stub fails every check."""

from __future__ import annotations

import pytest
import torch
from buggy import correct, failures, grade, native

from grader.checks import EXERCISES
from grader.checks.ch13_kernels import KERNEL_EXERCISES
from grader.sandbox.execute import execute
from grader.spec import Call


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
    assert checks or name in KERNEL_EXERCISES, "every exercise has a CUDA check"
    assert failures(grade(getattr(correct, name), checks)) == {}


def _as_if_on_cuda(fn, check):
    """Outcomes of a CUDA check computed on the CPU, with their devices reported
    as "cuda" for the calls made on CUDA: the CUDA judges' logic, tested anywhere."""
    outcomes = []
    for call in check.calls:
        kwargs = {k: ("cpu" if k == "device" else v) for k, v in call.kwargs.items()}
        o = execute(fn, Call(call.args, kwargs, "cpu"), want_grads=check.want_grads)
        if call.device == "cuda" and o.error is None:
            o.devices = tuple("cuda" for _ in o.devices) if isinstance(o.devices, tuple) else "cuda"
        outcomes.append(o)
    return outcomes


#: Exercises whose answer is a plain value (an index, a bool): it has no device to leave behind.
PLAIN_ANSWERS = ("find_leaking_layer", "leaks_across_padding")


#: Chapter 13's kernels run on CUDA where a GPU is, in the interpreter on the CPU elsewhere: one call
#: cannot be made on both devices in one process, so they have no CUDA pair check.
@pytest.mark.parametrize("name", [n for n in EXERCISES if n not in PLAIN_ANSWERS + KERNEL_EXERCISES])
def test_cuda_judges_pass_a_correct_result_and_catch_one_left_on_the_cpu(name):
    (check,) = [c for c in EXERCISES[name].make_checks(4) if c.requires == "cuda"]
    assert {c.device for c in check.calls} == {"cuda", "cpu"}
    fn = getattr(correct, name)
    verdict = check.judge(check.calls, _as_if_on_cuda(fn, check))
    assert verdict.passed, verdict.message
    on_cpu = [execute(fn, Call(c.args, {k: ("cpu" if k == "device" else v) for k, v in c.kwargs.items()}))
              for c in check.calls]
    verdict = check.judge(check.calls, on_cpu)
    assert not verdict.passed and "expected cuda" in verdict.message


def test_cuda_judge_compares_with_the_students_own_cpu_result():
    (check,) = [c for c in EXERCISES["causal_mask"].make_checks(4) if c.requires == "cuda"]
    outcomes = _as_if_on_cuda(correct.causal_mask, check)
    for i, call in enumerate(check.calls):
        if call.device == "cpu":  # the student's CPU path is broken, the CUDA path is not
            outcomes[i] = execute(lambda n, device=None: correct.causal_mask(n).T, call)
    verdict = check.judge(check.calls, outcomes)
    assert not verdict.passed and "differs from your CPU result" in verdict.message
