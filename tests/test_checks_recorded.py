"""The public checks recorded as data (grader.checks.recorded) judge as the reference's checks do.

The student template grades with the recording, not with ``attnmask``: every
classic mistake, correct and trivial implementation must get, on every public check,
the same verdict and the same words from both.
"""

from __future__ import annotations

import pytest
import torch
from buggy import correct, grade, native, trivial
from buggy.mistakes import BUGS

from grader.checks import declared, recorded
from grader.spec import Call, Check


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(the reference's public checks, the public checks rebuilt from a recording written to disk)."""
    exercises = declared()
    folder = tmp_path_factory.mktemp("recorded")
    recorded.write(recorded.record(exercises), folder)
    replayed = recorded.load(folder)
    assert list(replayed) == list(exercises)
    return ({n: ex.make_checks(0, hidden=False) for n, ex in exercises.items()},
            {n: ex.make_checks(0, hidden=False) for n, ex in replayed.items()})


def said(verdicts) -> dict[str, tuple[bool, str, str]]:
    return {name: (v.passed, v.message, v.detail) for name, v in verdicts.items()}


def _students():
    for bug in BUGS:
        yield pytest.param(bug.exercise, bug.fn, id=bug.id)
    for module in (correct, native, trivial):
        for name in dir(module):
            fn = getattr(module, name)
            if callable(fn) and getattr(fn, "__module__", "") == module.__name__ and not name.startswith("_"):
                yield pytest.param(name, fn, id=f"{module.__name__.split('.')[-1]}.{name}")


@pytest.mark.parametrize(("exercise", "fn"), list(_students()))
def test_recorded_checks_say_what_the_reference_checks_say(both, exercise, fn):
    reference, replayed = both
    if exercise not in reference:
        pytest.skip(f"{exercise} is not an exercise")
    assert [c.name for c in replayed[exercise]] == [c.name for c in reference[exercise]]
    assert said(grade(fn, replayed[exercise])) == said(grade(fn, reference[exercise]))


def test_a_named_mistake_is_named_from_the_recording(both):
    """Not only the same words: the recording names mistakes (an empty recording would agree on passes)."""
    _, replayed = both
    wrong = lambda n, *, device=None: torch.ones(n, n, dtype=torch.bool, device=device).triu()  # noqa: E731
    wrong.__name__ = "causal_mask"
    verdicts = grade(wrong, replayed["causal_mask"])
    assert "the triangle is on the wrong side" in verdicts["matches reference (n=4)"].message


def test_the_recording_loads_without_running_code(both, tmp_path):
    """weights_only: a file that would build an arbitrary object is refused, not run."""
    import pickle

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    bad = tmp_path / "causal_mask.pt"
    torch.save({"format": recorded.FORMAT, "tree": Boom(), "blob": torch.zeros(0)}, bad, pickle_module=pickle)
    with pytest.raises(pickle.UnpicklingError):
        recorded.read_exercise("causal_mask", tmp_path)


def test_a_judge_the_template_cannot_rebuild_stops_the_release():
    exercise = declared()["causal_mask"]
    check = Check("made by hand", [Call((3,))], lambda calls, outcomes: None, public=True)
    homemade = type(exercise)(exercise.name, exercise.chapter, lambda seed=0, hidden=True: [check],
                              exercise.points, exercise.statement)
    with pytest.raises(TypeError, match="cannot rebuild"):
        recorded.record({"causal_mask": homemade})


def test_a_changed_answer_makes_the_data_stale(tmp_path):
    data = recorded.record({"causal_mask": declared()["causal_mask"]})
    recorded.write(data, tmp_path)
    assert not recorded.stale(data, tmp_path)
    answers = next(iter(data["exercises"][0]["recipes"].values()))["answers"]
    first = next(iter(answers.values()))
    first["want"][0] = ~first["want"][0]
    assert recorded.stale(data, tmp_path)


def test_the_public_checks_catch_nan_gradients_of_an_added_bias(both):
    """Exercise 2.2's public checks run the backward pass: an answer right in the forward pass
    whose added -inf sends NaN back from a fully masked row fails check() and is told why,
    while the same answer that fills the -inf in (tests/buggy/correct.py) passes."""
    from buggy.mistakes import softmax_additive_patched

    from grader.mistakes import MISTAKES

    _, replayed = both
    failed = {n: v.message for n, v in grade(softmax_additive_patched, replayed["masked_softmax"]).items()
              if not v.passed}
    assert list(failed) == ["finite gradients with a fully masked row, match reference"]
    assert MISTAKES["nan_grads"] in next(iter(failed.values()))
    assert all(v.passed for v in grade(correct.masked_softmax, replayed["masked_softmax"]).values())
