"""Code that does nothing earns nothing: constants, random values, inputs handed
back, unmasked attention and transposed masks all score 0, although they meet
every property check (dtype, device, inputs unchanged, invariances)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from buggy import grade
from buggy.trivial import TRIVIAL

from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

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
