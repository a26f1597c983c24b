"""``with explore():`` turns an exercise stub into one line and lets every other error through."""

import pytest

from grader import explore
from grader.explore_cells import stub_exercise


def _stub():
    raise NotImplementedError("causal_mask: build the (n, n) causal mask, bool (see exercise 1.1)")


def test_a_stub_prints_one_line_naming_the_exercise(capsys):
    with explore():
        print("before")
        _stub()
        print("never")
    assert capsys.readouterr().out == "before\nExplore: finish exercise 1.1 (causal_mask) first.\n"


def test_the_students_own_bugs_propagate():
    with pytest.raises(ValueError), explore():
        raise ValueError("a bug")
    # torch's own NotImplementedError (no kernel for a dtype) is not a stub
    with pytest.raises(NotImplementedError), explore():
        raise NotImplementedError("\"tril\" not implemented for 'UInt16'")


def test_a_finished_block_runs_through(capsys):
    with explore():
        print("done")
    assert capsys.readouterr().out == "done\n"
    assert stub_exercise(ValueError("x (see exercise 1.1)")) is None
