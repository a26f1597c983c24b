"""Issue 46 item 5's mutant classes lose points at every seed tried: each
class is separated by a case drawn at every seed (fills that stand in for -inf beside sinks and allowed
scores far below -1e9, a sink far above every score, softmax in half precision, the size boundaries of
block_diffusion_mask, tensors made on the default device), and the correct answers keep full marks."""

from __future__ import annotations

import pytest
import torch
from buggy import correct, failures, grade, native
from buggy.mutants import CLASSES_46

from grader.checks import EXERCISES

SEEDS = (0, 7, 29, 1234567)


def _checks(name: str, seed: int):
    return [c for c in EXERCISES[name].make_checks(seed, hidden=True) if c.requires is None]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "mutant"), CLASSES_46, ids=[f"{n}-{m.__name__}" for n, m in CLASSES_46])
def test_mutant_class_loses_points(name, mutant, seed):
    assert failures(grade(mutant, _checks(name, seed))), f"{mutant.__name__} passes every check (seed {seed})"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted({n for n, _ in CLASSES_46}))
def test_correct_answers_keep_full_marks_on_the_new_cases(name, seed):
    for module in (correct, native):
        fn = getattr(module, name, None)
        if fn is not None:
            assert failures(grade(fn, _checks(name, seed))) == {}, f"{module.__name__}.{name} (seed {seed})"


def test_the_default_device_check_runs_the_call_under_another_default_device():
    """The property's calls keep their inputs on the CPU and move only the default device."""
    checks = [c for c in _checks("topk_selection_mask", 0) if "PyTorch's default" in c.name]
    assert checks and all(c.default_device == "meta" and c.device == "cpu" for c in checks[0].calls)
    from grader.sandbox.execute import execute

    seen = execute(lambda x, *rest, **kw: torch.arange(x.shape[-1]) + x[0, 0], checks[0].calls[0])
    assert seen.error is not None  # a tensor made without device= met the CPU input on meta
