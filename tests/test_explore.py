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


# --------------------------------------------------------------------------- grading skips Explore blocks

from grader import engine, submission  # noqa: E402
from grader.results import PASSED  # noqa: E402


def test_a_top_level_with_explore_block_is_not_run_by_grading():
    tree = submission.parse("import grader\nfrom grader import explore\n"
                            "with explore():\n    x = 1\n"
                            "with grader.explore() as e, open('f'):\n    y = 2\n"
                            "with open('f') as f:\n    z = 3\n"
                            "with explorer():\n    w = 4\n"
                            "if True:\n    pass\n")
    kept = [(type(s).__name__, s.lineno) for s in submission.kept_statements(tree)]
    assert kept == [("Import", 1), ("ImportFrom", 2), ("With", 7), ("With", 9), ("If", 11)]


def _notebook(cells: list[tuple[str, list[str]]]) -> str:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(source, metadata={"tags": tags} if tags else {}) for source, tags in cells])
    return nbformat.writes(nb)


def test_code_cells_tagged_explore_are_not_read():
    text = _notebook([("x = 1", []), ("y = 2", ["explore"]), ("z = 3", ["other"])])
    assert [(c.number, c.source.strip()) for c in submission.notebook_cells(text, "nb.ipynb")] == [
        (1, "x = 1"), (3, "z = 3")]


CAUSAL = ("def causal_mask(n, *, device=None):\n"
          "    pos = torch.arange(n, device=device)\n"
          "    return pos[None, :] <= pos[:, None]\n")


@pytest.mark.slow
def test_grading_imports_explore_and_skips_both_kinds_of_explore_block(tmp_path):
    """In the sandboxed worker `from grader import check, explore` imports cleanly; an Explore
    block that would hang or rebind the graded function, and an `explore`-tagged cell that would,
    cost nothing."""
    path = tmp_path / "nb.ipynb"
    path.write_text(_notebook([
        ("import torch\n\nfrom grader import check, explore", []),
        (CAUSAL, []),
        ("with explore():\n    causal_mask = None\n    while True:\n        pass", ["explore"]),
        ("with explore():\n    causal_mask = lambda n, device=None: torch.zeros(n, n, dtype=torch.bool)\n"
         "    while True:\n        pass", []),
        ("causal_mask = None\nraise SystemExit", ["explore"]),
    ]))
    report = engine.grade(path, exercises=["causal_mask"], timeout=2)
    result = report.exercise("causal_mask")
    assert result.status == PASSED and result.score == result.max_score, result.message
    assert report.notes == [], report.notes
