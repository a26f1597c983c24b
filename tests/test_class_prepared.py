"""Class mode builds a class's cases and reference outputs once, in the process it forks
every grading from (grader.checks.prepare_class); a grading that reads them gives the
report a grading that computes them gives, and computes no reference itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import checks
from grader.checks.common import judges
from grader.runners.single import cli

REPO = Path(__file__).resolve().parent.parent
SEED = "271828182845904523536028747135266249775"


@pytest.fixture
def counted(monkeypatch):
    """How many references were computed (not read from what prepare_class kept)."""
    computed = []
    original = judges.as_list  # what judges.reference computes goes through it; what it kept does not

    def as_list(x):
        computed.append(x)
        return original(x)

    monkeypatch.setattr(judges, "as_list", as_list)
    monkeypatch.setenv("GRADER_SEED", SEED)
    yield computed
    checks.forget_class()


def _grade(path: str, out: Path) -> dict:
    assert cli.main([str(REPO / path), "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    data.pop("execution_time")
    return data


@pytest.mark.parametrize("submission", ["tests/submissions/mistakes.py", "tests/submissions/correct.py"])
def test_a_prepared_class_grades_alike_without_computing_references(submission, counted, tmp_path):
    fresh = _grade(submission, tmp_path / "fresh.json")
    computed_fresh = len(counted)
    kept = checks.prepare_class(int(SEED))
    assert kept > 100 and computed_fresh > 100
    counted.clear()
    prepared = _grade(submission, tmp_path / "prepared.json")
    assert prepared == fresh
    # what is still computed while judging: calls the judges build themselves (e.g. the
    # shifted inputs of an invariance), never a case of the checks
    assert len(counted) < computed_fresh / 4, (len(counted), computed_fresh)


def test_what_a_judge_does_to_a_kept_reference_does_not_reach_the_next_grading(counted):
    checks.prepare_class(int(SEED))
    check = checks.EXERCISES["causal_mask"].make_checks(int(SEED), True)[0]
    recipe = next(r for r in vars(checks.chapters()[1]).values()
                  if isinstance(r, judges.Recipe) and r.name == "causal_mask")
    first = judges.reference(recipe, check.calls[0])[0]
    first.logical_not_()  # a judge that (wrongly) changes what it was given
    assert judges.reference(recipe, check.calls[0])[0].equal(~first)


def test_a_prepared_class_computes_no_reference_gradients(monkeypatch, tmp_path):
    """The reference's gradients (the gradient checks) are kept for the class too."""
    import functools

    from grader.checks.common import properties

    monkeypatch.setenv("GRADER_SEED", SEED)
    original = properties.grads_of
    computed = []

    @functools.wraps(original)
    def grads_of(recipe, call):
        computed.append(recipe.name)
        return original(recipe, call)

    monkeypatch.setattr(properties, "grads_of", grads_of)
    try:
        checks.prepare_class(int(SEED))
        computed.clear()
        _grade("tests/submissions/correct.py", tmp_path / "r.json")
    finally:
        checks.forget_class()
    assert computed == []
    _grade("tests/submissions/correct.py", tmp_path / "fresh.json")  # unprepared: computed again
    assert len(computed) > 5
