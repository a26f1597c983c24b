"""A submission is read as files, never through links.

Students' repositories are cloned into a folder of the instructor's, often inside
the course checkout: a notebook that is a symbolic link to ``solutions/`` or to
another student's file would be graded as the student's own, and one that is a
FIFO, or a link to ``/dev/zero``, would hang or exhaust the grader. Every such entry
is named in the report and not read, in a single grading and in class mode, where
it costs that student's row and never the class.
"""

from __future__ import annotations

import csv
import os
import shutil
import stat
from pathlib import Path

import pytest

from grader import engine, files, submission
from grader.runners.classmode import roster
from grader.runners.classmode.classroom import grade_class

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "ex01_leakage.ipynb"


def _relative_link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def test_a_notebook_linked_to_the_solutions_scores_0_not_100(tmp_path):
    """The link is relative (../../solutions/...), as a student's clone inside the course has it."""
    clone = ROOT / "build" / f"links-{os.getpid()}"
    try:
        _relative_link(clone / "mallory" / "ex01_leakage.ipynb", SOLUTION)
        assert (clone / "mallory" / "ex01_leakage.ipynb").read_text() == SOLUTION.read_text()  # it works
        for path in (clone / "mallory", clone / "mallory" / "ex01_leakage.ipynb"):
            report = engine.grade(path, exercises=["causal_mask"], timeout=5)
            assert report.score == 0 and not report.usage_error, report.to_dict()
            assert any("ex01_leakage.ipynb is a symbolic link" in n for n in report.notes), report.notes
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def test_links_pipes_and_devices_are_named_and_not_read(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "mine.py").write_text("def causal_mask(n, *, device=None):\n    raise NotImplementedError\n")
    os.mkfifo(sub / "pipe.ipynb")
    os.symlink("/dev/zero", sub / "zero.py")
    os.symlink(ROOT / "solutions", sub / "more")
    (sub / "deep").mkdir()
    os.symlink(SOLUTION, sub / "deep" / "ex01.ipynb")
    src = submission.read(sub)
    assert src.files == ["mine.py"]
    said = "\n".join(src.problems)
    for name, what in (("pipe.ipynb", "a named pipe (FIFO)"), ("zero.py", "a symbolic link"),
                       ("more", "a symbolic link"), ("deep/ex01.ipynb", "a symbolic link")):
        assert f"{name} is {what}: the grader reads only plain files" in said, said
    # read() itself refuses a link in any component, a pipe, and what is over the limit
    with pytest.raises(files.NotAFile, match="symbolic link"):
        files.read(sub, "more/ex01_leakage.ipynb", 2**20)
    with pytest.raises(files.NotAFile, match="named pipe"):
        files.read(sub, "pipe.ipynb", 2**20)
    with pytest.raises(files.NotAFile, match="limit"):
        files.read(sub, "mine.py", 10)
    with pytest.raises(files.NotAFile):
        files.read(sub, "../sub/mine.py", 2**20)
    assert files.read(sub, "mine.py", 2**20).startswith(b"def causal_mask")
    (sub / "pipe.ipynb").unlink()  # a pipe left in /tmp would stall whatever reads it


def _ex01(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOLUTION, folder / "ex01_leakage.ipynb")


@pytest.mark.slow
def test_class_mode_survives_links_to_other_students_fifos_and_dev_zero(tmp_path):
    """alice is honest; bob links alice's notebook; carol's notebook is a FIFO, dave's a link to
    /dev/zero, erin's folder a link to the solutions. Hashing, the roster and grading go on; only
    alice scores."""
    subs = tmp_path / "subs"
    _ex01(subs / "alice")
    _relative_link(subs / "bob" / "ex01_leakage.ipynb", subs / "alice" / "ex01_leakage.ipynb")
    (subs / "carol").mkdir()
    os.mkfifo(subs / "carol" / "ex01_leakage.ipynb")
    (subs / "dave").mkdir()
    os.symlink("/dev/zero", subs / "dave" / "ex01_leakage.ipynb")
    os.symlink(ROOT / "solutions", subs / "erin")
    for s in ("alice", "bob", "carol", "dave", "erin"):
        assert len(roster.content_hash(subs / s)) == 64  # never blocks, never raises
    rows = grade_class(subs, tmp_path / "out", jobs=2, seed=0, timeout=120, progress=False,
                       extra=["--exercise", "causal_mask"])
    by = {r.student: r for r in rows}
    assert set(by) == {"alice", "bob", "carol", "dave", "erin"}
    assert by["alice"].total == by["alice"].max > 0
    for s in ("bob", "carol", "dave", "erin"):
        assert by[s].total == 0 and by[s].status == "graded", by[s]
    with open(tmp_path / "out" / "grades.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 5
    log = (tmp_path / "out" / "bob" / "grader.log").read_text()
    assert "ex01_leakage.ipynb is a symbolic link" in log
    assert stat.S_ISFIFO(os.lstat(subs / "carol" / "ex01_leakage.ipynb").st_mode)  # untouched
    (subs / "carol" / "ex01_leakage.ipynb").unlink()  # a pipe left in /tmp would stall whatever reads it
