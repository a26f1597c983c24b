"""A class run's ``feedback.md`` says why points were lost, in what a student may see.

A real class of five graded by class mode with a secret seed: a chapter handed in correct, one
with a syntax error, one unfinished (the generated stub), one whose first cell raises at top
level, and an empty folder. Each file must name the reason for every exercise below full marks,
and none may hold the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.runners.classmode import classroom, feedback

ROOT = Path(__file__).resolve().parents[1]
SEED = 918273645546372819


def _notebook(src: str, edit) -> dict:
    nb = json.loads((ROOT / src).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and edit(cell):
            break
    return nb


def _syntax_error(cell) -> bool:
    text = "".join(cell["source"])
    if "def padding_mask" not in text:
        return False
    cell["source"] = [text.replace("def padding_mask(", "def padding_mask((", 1)]
    return True


def _raising_first_cell(cell) -> bool:
    cell["source"] = ["import a_module_nobody_installed\n", *cell["source"]]
    return True


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("class")
    subs = base / "subs"
    notebooks = {
        "alice": json.loads((ROOT / "solutions/ex03_padding.ipynb").read_text()),
        "bob": _notebook("solutions/ex03_padding.ipynb", _syntax_error),
        "carol": json.loads((ROOT / "exercises/ex03_padding.ipynb").read_text()),
        "erin": _notebook("solutions/ex03_padding.ipynb", _raising_first_cell),
    }
    for login, nb in notebooks.items():
        (subs / login).mkdir(parents=True)
        (subs / login / "ex03_padding.ipynb").write_text(json.dumps(nb))
    (subs / "dave").mkdir()
    (subs / "dave" / "notes.txt").write_text("I ran out of time\n")
    out = base / "grades"
    assert classroom.main([str(subs), "--out", str(out), "--seed", str(SEED), "--no-progress", "--no-report",
                           "--jobs", "2"]) == 0
    return out


def _text(run: Path, who: str) -> str:
    text = (run / who / "feedback.md").read_text()
    assert str(SEED) not in text
    return text


def _row(text: str, exercise: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {exercise} ("))


def test_a_syntax_error_is_named_with_its_line(run):
    text = _text(run, "bob")
    row = _row(text, "padding_mask")
    assert "SyntaxError" in row and "line 1 of cell" in row and "0 of 0" not in row


def test_an_unfinished_exercise_reads_not_implemented(run):
    assert "not implemented" in _row(_text(run, "carol"), "padding_mask")


def test_an_exercise_never_handed_in_reads_not_found(run):
    assert "not found" in _row(_text(run, "alice"), "causal_mask")
    assert _row(_text(run, "alice"), "padding_mask").endswith("|  |")  # full marks: no reason


def test_a_first_cell_that_raises_is_noted(run):
    text = _text(run, "erin")
    assert "## Loading your submission" in text and "raised an exception" in text


def test_an_empty_submission_says_zero_of_the_whole_and_why(run):
    text = _text(run, "dave")
    assert "**Score: 0 / 100**" in text and "no .ipynb or .py file" in text


def test_a_failing_public_check_and_failing_hidden_checks_are_told_apart():
    public = {"name": "causal_mask (chapter 1)", "score": 0, "max_score": 1,
              "output": "✗ n = 3 (public): the diagonal is missing\n✓ n = 1 (hidden)"}
    hidden = {"name": "attention (chapter 2)", "score": 0.5, "max_score": 3,
              "output": "✓ small (public)\n✗ h1 (hidden): …\n✓ h2 (hidden)"}
    results = {"score": 0.5, "max_score": 4, "tests": [public, hidden],
               "extra_data": {"status": {"causal_mask": "failed", "attention": "partial"}}}
    text = feedback.feedback_text(results, student="s")
    assert "1 public check(s) fail" in _row(text, "causal_mask")
    assert "1 of 2 hidden checks fail" in _row(text, "attention") and "h1" not in text
