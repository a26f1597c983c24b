"""What students hand in: notebooks, .py files, folders, and everything that
goes wrong with them. Bad input gets a clear message and a results file, never
a traceback; unrelated mess in a notebook costs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import engine, submission
from grader.results import NOT_FOUND, NOT_IMPLEMENTED, NOT_IMPLEMENTED_MESSAGE, PASSED
from grader.runners.single import cli

ROOT = Path(__file__).parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"
BAD = SUBMISSIONS / "bad"

PARTIAL_PY = '''import torch


def causal_mask(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] <= pos[:, None]


def padding_mask(lengths, max_len):
    return (torch.arange(max_len)[None, :] < lengths[:, None]


def sliding_window_mask(n, window, *, device=None):
    pos = torch.arange(n, device=device)
    i, j = pos[:, None], pos[None, :]
    return (j <= i) & (i - j < window)
'''

PROSE = """Dear grader,

I did not finish the exercises this week, but here is what I understood:
a causal mask lets token i look at tokens j <= i only.
"""


def _cli_json(tmp_path: Path, path: Path | str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "results.json"
    code = cli.main([str(path), "--json", str(out), "--quiet", *extra])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("name, message", [
    ("empty.py", "empty.py is empty"),
    ("empty.ipynb", "empty.ipynb is empty"),
    ("truncated.ipynb", "truncated.ipynb is not a readable notebook: invalid JSON"),
    ("binary.ipynb", "binary.ipynb could not be read: it is a binary file"),
])
def test_unreadable_input_gets_a_message_and_a_results_file(tmp_path, name, message):
    code, results = _cli_json(tmp_path, BAD / name)
    assert code == 0  # grading completed: the grade is zero
    assert results["score"] == 0 and results["max_score"] > 0
    assert message in results["output"]
    assert all(message in t["output"] for t in results["tests"])
    assert len(results["tests"]) == len(engine.load_registry())


@pytest.mark.parametrize("name, message", [
    ("report.txt", "report.txt is not a notebook (.ipynb) or a .py file"),
    ("no_notebooks", "holds no notebooks (.ipynb) or .py files"),
])
def test_what_is_no_submission_at_all_is_a_usage_error(tmp_path, name, message):
    code, results = _cli_json(tmp_path, BAD / name)
    assert code == cli.USAGE_ERROR  # the caller's mistake, not a grade of zero
    assert results["score"] == 0 and results["tests"] == [] and message in results["output"]


def test_notebook_without_exercises(tmp_path):
    code, results = _cli_json(tmp_path, BAD / "no_exercises.ipynb", "--exercise", "causal_mask")
    assert code == 0 and results["score"] == 0
    assert "no exercise functions found" in results["output"]
    assert "defines no function named causal_mask" in results["tests"][0]["output"]


def test_text_that_is_not_python(tmp_path):
    (tmp_path / "prose.py").write_text(PROSE)
    code, results = _cli_json(tmp_path, tmp_path / "prose.py", "--exercise", "causal_mask")
    assert code == 0 and results["score"] == 0
    assert "SyntaxError" in results["output"] and "line 1 of prose.py" in results["output"]


def test_missing_path_is_a_usage_error_with_a_results_file(tmp_path):
    code, results = _cli_json(tmp_path, tmp_path / "nowhere", "--exercise", "causal_mask")
    assert code == cli.USAGE_ERROR
    assert "does not exist" in results["output"] and results["score"] == 0


def test_syntax_error_costs_only_the_functions_next_to_it(tmp_path):
    (tmp_path / "partial.py").write_text(PARTIAL_PY)
    report = engine.grade(tmp_path / "partial.py",
                          exercises=["causal_mask", "padding_mask", "sliding_window_mask"])
    assert report.exercise("causal_mask").status == PASSED
    assert report.exercise("sliding_window_mask").status == PASSED
    pad = report.exercise("padding_mask")
    assert pad.status == NOT_FOUND
    assert "SyntaxError" in pad.message and "partial.py" in pad.message


@pytest.mark.slow
def test_messy_notebook_costs_nothing(tmp_path):
    """Plots, a cell that raises, magics, a shell escape, a %%bash cell, a scratch
    loop, a hanging cell, sys.exit and check() calls; one cell with a syntax error."""
    names = ["causal_mask", "padding_mask", "sliding_window_mask", "prefix_lm_mask", "document_mask"]
    report = engine.grade(SUBMISSIONS / "messy.ipynb", exercises=names, timeout=2)
    for name in ("causal_mask", "sliding_window_mask", "prefix_lm_mask", "document_mask"):
        assert report.exercise(name).status == PASSED, (name, report.exercise(name).message)
    pad = report.exercise("padding_mask")
    assert pad.status == NOT_FOUND and "SyntaxError" in pad.message and "cell 7" in pad.message
    notes = "\n".join(report.notes)
    assert "cell 6 of messy.ipynb raised ZeroDivisionError" in notes
    assert "cell 11 of messy.ipynb ran longer than 2 s" in notes
    assert "(it defines padding_mask)" in notes


@pytest.mark.slow
def test_exercise_stubs_score_zero_not_implemented():
    report = engine.grade(ROOT / "exercises")
    assert report.score == 0 and report.max_score > 0
    for e in report.exercises:
        assert e.status == NOT_IMPLEMENTED, (e.name, e.status, e.message)
        assert e.message == NOT_IMPLEMENTED_MESSAGE


@pytest.mark.slow
def test_solution_notebooks_score_full_marks():
    report = engine.grade(ROOT / "solutions")
    failing = [(e.name, e.message) for e in report.exercises if e.status != PASSED]
    assert not failing
    assert report.score == report.max_score > 0


@pytest.mark.slow
def test_only_defined_exercises_are_graded_the_rest_not_found(tmp_path):
    src = (SUBMISSIONS / "correct.py").read_text()
    keep = src.split("def to_additive")[0]  # causal_mask and influence_matrix only
    (tmp_path / "two.py").write_text(keep + "\n\ndef causal_masks(n):\n    return None\n")
    report = engine.grade(tmp_path / "two.py", exercises=["causal_mask", "influence_matrix", "to_additive"])
    assert [e.status for e in report.exercises] == [PASSED, PASSED, NOT_FOUND]
    assert "defines no function named to_additive" in report.exercise("to_additive").message


@pytest.mark.slow
def test_misnamed_function_gets_a_hint(tmp_path):
    (tmp_path / "typo.py").write_text("def causal_masks(n, *, device=None):\n    return None\n")
    report = engine.grade(tmp_path / "typo.py", exercises=["causal_mask"])
    assert "there is a causal_masks: rename it?" in report.exercise("causal_mask").message


# --------------------------------------------------------------------------- reading, without a worker


def test_magics_become_pass_and_keep_line_numbers():
    src = "%matplotlib inline\nimport torch\n!ls\nfiles = !ls\nx = 1\nmsg = ('%d'\n       % x)\n"
    out = submission.strip_magics(src)
    assert out.splitlines() == ["pass", "import torch", "pass", "pass", "x = 1", "msg = ('%d'", "       % x)"]
    assert submission.strip_magics("%%bash\necho hi\n") is None
    assert submission.strip_magics("%%time\nx = 1\n").splitlines() == ["", "x = 1"]


def test_python_file_is_split_only_when_it_does_not_parse():
    assert len(submission.python_cells("import torch\n\ndef f():\n    return 1\n", "ok.py")) == 1
    cells = submission.python_cells(PARTIAL_PY, "partial.py")
    assert [c.line_offset for c in cells] == [0, 3, 8, 12]
    errors = [submission.syntax_error(c) for c in cells]
    assert [e is not None for e in errors] == [False, False, True, False]
    assert "line 10 of partial.py" in errors[2]


def test_folder_reading_skips_checkpoints_and_hidden_folders(tmp_path):
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.py").write_text("def causal_mask(n): ...\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("x = 1\n")
    (tmp_path / "a.py").write_text("y = 2\n")
    src = submission.read(tmp_path)
    assert src.files == ["a.py", "sub/b.py"]


def test_only_definitions_run():
    tree = submission.parse("import torch\nx = 1\nprint(x)\nfor i in range(3):\n    pass\n"
                            "def f():\n    pass\nwhile True:\n    pass\nif x:\n    y = 2\n")
    kept = [type(s).__name__ for s in submission.kept_statements(tree)]
    assert kept == ["Import", "Assign", "FunctionDef", "If"]
