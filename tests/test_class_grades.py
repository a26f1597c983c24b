"""grades.csv as a new instructor would read it: the real grader on a small class that
mixes the layouts the guide shows, a roster naming files, and a student one second late.

* every student's maximum is the assignment's, a lone chapter notebook included, and the
  row says which exercises were not found;
* a roster ``folder`` that names a notebook file (``carol.ipynb``) finds it, and one that
  names nothing says what the roster wants; no unnamed off-roster row appears;
* one second late is one started day: ``days_late`` 1 and the penalty of one day.
"""

from __future__ import annotations

import csv
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from grader import engine
from grader.runners.classmode import classroom
from grader.runners.classmode.scores import _fmt, contract_exercises

REPO = Path(__file__).resolve().parents[1]
DUE = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
CHAPTER_1 = tuple(name for name, ex in engine.load_registry().items() if ex.chapter == 1)


@pytest.mark.slow
def test_grades_csv_row_by_row(tmp_path, monkeypatch):
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(REPO / "solutions" / "ex01_leakage.ipynb", subs / "carol.ipynb")  # the guide's carol.ipynb
    (subs / "dave").mkdir()
    shutil.copy(REPO / "solutions" / "ex01_leakage.ipynb", subs / "dave" / "ex01_leakage.ipynb")
    shutil.copy(REPO / "solutions" / "ex01_leakage.ipynb", subs / "erin.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,folder,submitted\n"
                      f"u1,Carol Ng,carol.ipynb,{(DUE - timedelta(hours=1)).isoformat()}\n"
                      f"u2,Dave Roe,dave,{(DUE + timedelta(seconds=1)).isoformat()}\n"
                      f"u3,Erin Poe,erin,{DUE.isoformat()}\n"
                      "u4,Sam Lee,s29.ipynb,\n")
    out = tmp_path / "out"
    assert classroom.main([str(subs), "--out", str(out), "--jobs", "2", "--seed", "5", "--timeout", "120",
                           "--no-progress", "--no-report", "--roster", str(roster), "--due", DUE.isoformat(),
                           "--late-policy", "10/day"]) == 0
    with open(out / "grades.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == ["u1", "u2", "u3", "u4"]  # the roster, and nobody off it
    carol, dave, erin, sam = rows
    points = engine.load_registry()
    ch1 = _fmt(sum(points[e].points for e in CHAPTER_1))  # what chapter 1's notebook earns
    absent = [e for e in contract_exercises() if e not in CHAPTER_1]
    for r in (carol, dave, erin):
        assert r["status"] == "graded"
        assert (r["raw"], r["max"]) == (ch1, "100")  # the assignment's maximum, not chapter 1's
        assert r["message"].startswith(f"not found ({len(absent)} of {len(absent) + len(CHAPTER_1)}): ")
        assert r["message"].endswith(", ".join(absent))
        assert all(r[e] == "0" for e in absent) and r["causal_mask"] == _fmt(points["causal_mask"].points)
    assert carol["student"] == "carol"  # found by its file name
    assert (carol["days_late"], carol["penalty"], carol["final"]) == ("0", "0", ch1)
    assert (erin["days_late"], erin["penalty"]) == ("0", "0")  # handed in at the due date: on time
    # one second late: one started day, and the penalty of one day (10 % of the maximum, at most the score)
    assert (dave["days_late"], dave["penalty"], dave["final"]) == ("1", ch1, "0")
    assert (sam["status"], sam["max"], sam["final"]) == ("missing", "100", "0")
    assert "'s29.ipynb' names no folder or file" in sam["message"]
