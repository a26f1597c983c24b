"""Code that does nothing earns nothing: constants, random values, inputs handed
back, unmasked attention and transposed masks all score 0, although they meet
every property check (dtype, device, inputs unchanged, invariances)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from buggy import grade
from buggy.trivial import TRIVIAL

from grader.checks import EXERCISES
from grader.results import CheckResult, score_of
from grader.sandbox.execute import execute

SUBMISSIONS = Path(__file__).parent / "submissions"


def points(fn, name: str, seed: int) -> float:
    checks = EXERCISES[name].make_checks(seed, hidden=True)
    verdicts = grade(fn, checks)
    results = [CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
               for c in checks if c.name in verdicts]
    return EXERCISES[name].points * score_of(results)


@pytest.mark.parametrize("seed", [0, 7, 12345])
@pytest.mark.parametrize("style", sorted(TRIVIAL))
def test_trivial_submission_scores_zero(style, seed):
    scores = {name: points(fn, name, seed) for name, fn in TRIVIAL[style].items()}
    assert sum(scores.values()) <= 2.0, scores
    assert {n: s for n, s in scores.items() if s > 0} == {}, f"{style} earns points for doing nothing"


def test_properties_alone_earn_nothing():
    """The rule itself: passing every property check with every value check failed is 0."""
    checks = [CheckResult("values", False, 1.0, False), CheckResult("edge", False, 1.0, True, kind="edge"),
              *[CheckResult(f"p{i}", False, 1.0, True, kind="property") for i in range(5)]]
    assert score_of(checks) == 0.0


def test_partial_credit_follows_values_and_failed_properties_take_points_away():
    values = [CheckResult(f"v{i}", False, 1.0, i < 3) for i in range(4)]  # 3 of 4 general cases right
    edge = CheckResult("n = 1", False, 1.0, True, kind="edge")
    prop = CheckResult("dtype", False, 1.0, True, kind="property")
    assert score_of([*values, edge, prop]) == pytest.approx(4 / 5)
    prop.passed = False
    assert score_of([*values, edge, prop]) == pytest.approx(4 / 5 - 1 / 6)


@pytest.mark.slow
def test_constants_graded_end_to_end_score_zero(tmp_path):
    out = tmp_path / "results.json"
    p = subprocess.run([sys.executable, "-m", "grader", str(SUBMISSIONS / "constants.py"), "--json", str(out),
                        "--quiet"], capture_output=True, text=True, timeout=300)
    import json

    results = json.loads(out.read_text())
    assert results["score"] == 0, (results["score"], p.stderr)
    assert results["max_score"] > 0 and len(results["tests"]) >= 13  # every exercise it defines


MASK_EXERCISES = ("causal_mask", "padding_mask", "decoder_mask", "encoder_decoder_masks",
                  "sliding_window_mask", "prefix_lm_mask", "document_mask")


@pytest.mark.parametrize("name", MASK_EXERCISES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64])
def test_a_mask_of_the_wrong_dtype_is_a_wrong_mask(name, dtype):
    """A float 0/1 mask handed to SDPA is added to the scores and masks nothing: it earns
    nothing, whatever cells it has right (nor does an integer one)."""
    from buggy import correct

    right = getattr(correct, name)

    def cast(*args, **kwargs):
        out = right(*args, **kwargs)
        return tuple(m.to(dtype) for m in out) if isinstance(out, tuple) else out.to(dtype)

    assert points(right, name, 7) == EXERCISES[name].points
    assert points(cast, name, 7) == 0.0


def _guessable_cells(out) -> float:
    """Cells a blind guess must get right to match ``out``: every cell of a bool, integer or
    additive (0 / -inf) output; a float output with other values cannot be guessed."""
    if out is None or type(out) in (bool, int):
        # an answer: a bool is one yes/no; find_leaking_layer's is one of depth + 1 >= 4 values (2 bits)
        return 1 if type(out) is bool else 2
    total = 0
    for o in out if isinstance(out, tuple) else (out,):
        finite = o[torch.isfinite(o)] if o.dtype.is_floating_point else None
        if finite is not None and bool((finite != 0).any()):
            return math.inf
        total += o.numel()
    return total


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_a_case_a_blind_guess_can_pass_never_earns_alone(name):
    """A random mask matches one of a dozen cells once in a few thousand tries (CI saw a random
    padding_mask earn a point): every check that earns on its own holds at least 20 cells that a
    guess must get right, counted here on the correct function's outputs."""
    from buggy import correct

    right = getattr(correct, name)
    for seed in (0, 7, 12345):
        for check in EXERCISES[name].make_checks(seed, hidden=True):
            if check.kind != "value" or check.want_grads:
                continue  # a CUDA check counts its CPU halves: the same cases
            outputs = [execute(right, c).output for c in check.calls if c.device == "cpu"]
            cells = sum(_guessable_cells(out) for out in outputs)
            assert cells >= 20, (seed, check.name, cells)


def test_every_exercise_has_a_general_case_that_cannot_be_guessed():
    """Every exercise's hidden checks include, on the CPU and for any seed, a value check that a
    blind guess passes less than once in 2**20 tries: the one that lets its other cases earn."""
    for name, ex in EXERCISES.items():
        # find_leaking_layer's hidden models are redrawn until their margins hold (seconds a seed);
        # which kinds of check it declares does not depend on the seed
        for seed in range(6 if name == "find_leaking_layer" else 60):
            # on this machine: no CUDA; triton's checks run here (its interpreter)
            kinds = {c.kind for c in ex.make_checks(seed, hidden=True) if c.requires != "cuda"}
            assert "value" in kinds, (name, seed)


def test_the_public_checks_alone_still_earn_where_all_are_small():
    """Where every public case is small enough to guess (the student's check() runs only
    those), they stand alone: right code scores full marks on them."""
    from buggy import correct

    for name in ("causal_mask", "padding_mask", "packed_labels"):
        checks = EXERCISES[name].make_checks(0, hidden=False)
        assert all(c.kind != "value" for c in checks)
        verdicts = grade(getattr(correct, name), checks)
        results = [CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                   for c in checks]
        assert score_of(results) == 1.0
