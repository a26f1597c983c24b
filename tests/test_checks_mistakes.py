"""Each classic mistake fails, and the feedback names it in plain words."""

from __future__ import annotations

import pytest
from buggy import failures, grade
from buggy.mistakes import BUGS

from grader.checks import EXERCISES
from grader.checks.ch9_real import MISTAKES9
from grader.checks.ch10_serving import MISTAKES10
from grader.checks.ch11_parallel import MISTAKES11
from grader.mistakes import MISTAKES

#: Every named mistake: the shared ones and chapters 9, 10 and 11's own.
NAMED = {**MISTAKES, **MISTAKES9, **MISTAKES10, **MISTAKES11}


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_mistake_fails_with_its_diagnosis(bug):
    verdicts = grade(bug.fn, EXERCISES[bug.exercise].make_checks(7, hidden=True))
    failed = failures(verdicts)
    assert failed, f"{bug.id} passes every check"
    # A float mask is a wrong mask in every check that reads it, the dtype check included.
    everything_fails = bug.exercise == "influence_matrix" or bug.id == "causal_mask-causal_float"
    assert len(failed) < len(verdicts) or everything_fails, "only the broken property fails"
    text = NAMED.get(bug.says, bug.says)
    said = [name for name, message in failed.items() if text in message]
    assert said, f"no failing check says {text!r}; they say:\n" + "\n".join(
        f"  {name}: {message.splitlines()[0]}" for name, message in failed.items())


def test_every_named_mistake_has_a_buggy_variant():
    """Each message of MISTAKES is asserted by some buggy variant above, so a
    recogniser that stops matching is noticed."""
    assert set(NAMED) - {b.says for b in BUGS} == set()
