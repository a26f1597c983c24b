"""The sandbox holds wherever the course and its Python lie, or refuses and says why.

Each test lays out a copy of the course (its packages and ``solutions/``) and a venv the
way a user would, grades ``solutions/`` through the sandbox from there and expects
100/100 with the isolation block held; or, where student code could see the course's
content, a non-zero exit and a message that names the path. The venvs borrow the running
environment's packages (conftest's ``borrowing_venv``), so nothing is downloaded. The
machine's Python here and in CI is pyenv's, under ``/root``: every layout is also the
"Python under /root" layout. The installed wheel is tests/test_install.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.checks import POINTS
from grader.runners.classmode.classroom import grade_class
from grader.sandbox import bubblewrap

ROOT = Path(__file__).resolve().parent.parent
COURSE_POINTS = sum(POINTS.values())  # the registry's; 100 once every chapter is in
SUBMISSIONS = Path(__file__).parent / "submissions"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="the sandbox is Linux's")]


def _course(dest: Path) -> Path:
    """A copy of the course at ``dest``: what grading from a clone reads."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for name in ("attnmask", "grader", "solutions"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def _grade(python: Path, course: Path, *args: str, env: dict[str, str] | None = None,
           user: list[str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m grader ARGS`` run from ``course``; (the process, results.json)."""
    out = course.parent / "results.json"
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SEED", "VIRTUAL_ENV")}
    p = subprocess.run([*(user or []), str(python), "-m", "grader", *args, "--quiet", "--json", str(out)],
                       env={**base, "COLUMNS": "1000", **(env or {})}, capture_output=True, text=True,
                       timeout=600, cwd=course)
    results = json.loads(out.read_text()) if out.exists() else {}
    return p, results


def _held_100(p: subprocess.CompletedProcess, results: dict) -> None:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr
    assert results["score"] == results["max_score"] == COURSE_POINTS, results.get("output")
    isolation = results["extra_data"]["isolation"]
    assert isolation["seed_protected"] is True and isolation["measured"]["seen"] == "0", isolation
    assert isolation["bwrap"].endswith("bwrap") and isolation["bwrap_version"].startswith("bubblewrap")


def test_a_venv_inside_the_course_folder(tmp_path, borrowing_venv):
    """The README's own advice: ``python -m venv .venv`` in the repository root."""
    course = _course(tmp_path / "course")
    python = borrowing_venv(course / ".venv")
    _held_100(*_grade(python, course, "solutions/"))


def test_a_venv_outside_the_course_with_system_site_packages(tmp_path, borrowing_venv):
    course = _course(tmp_path / "course")
    python = borrowing_venv(tmp_path / "venv", system_site_packages=True)
    _held_100(*_grade(python, course, "solutions/"))


def test_torch_on_pythonpath_beside_the_course(tmp_path, borrowing_venv, running_site_packages):
    """torch comes from ``PYTHONPATH`` (an HPC module, Nix, ``pip install --target``), which
    also names the course itself, as a developer's shell has it: the sandbox shows the former."""
    course = _course(tmp_path / "course")
    python = borrowing_venv(tmp_path / "venv", pth=False)
    targets = []  # named like a `pip install --target` folder, not site-packages
    for i, folder in enumerate(running_site_packages):
        targets.append(tmp_path / f"pylib{i}")
        targets[-1].symlink_to(folder)
    path = os.pathsep.join(map(str, [course, *targets]))
    _held_100(*_grade(python, course, "solutions/", env={"PYTHONPATH": path}))


def test_pips_src_layout_shows_student_code_nothing_of_the_course(tmp_path, borrowing_venv):
    """``pip install -e git+...`` clones the course into ``<venv>/src/<name>``: the venv's prefix
    holds the course, so the sandbox binds the interpreter's folders, never the prefix. The
    seeker, which walks every folder it can see, finds no solution and no reference."""
    venv = tmp_path / "venv"
    python = borrowing_venv(venv)
    course = _course(venv / "src" / "attnmask")
    _held_100(*_grade(python, course, "solutions/"))
    p, results = _grade(python, course, str(SUBMISSIONS / "seeker.py"), "--exercise", "causal_mask",
                        env={"GRADER_SEED": "918273645512345678"})
    assert p.returncode == 0, p.stderr
    seen = p.stdout.split("SEEKER:", 1)[1].split("\n")[0] if "SEEKER:" in p.stdout else results["output"]
    assert "NOITULOS NIGEB #" not in seen and "(ksam_lasuac fed" not in seen, seen[:2000]
    assert results["score"] == 0 and results["extra_data"]["isolation"]["measured"]["seen"] == "0"


def test_a_user_who_is_not_root(tmp_path, borrowing_venv):
    """The .venv layout again, graded by uid 1000 (a user namespace of its own when the tests
    run as root: it reads what root reads, without root's powers)."""
    if os.geteuid() != 0:
        user = []
    elif bubblewrap.available():
        user = [bubblewrap.find(), "--dev-bind", "/", "/", "--unshare-user", "--uid", "1000", "--gid", "1000",
                "--die-with-parent", "--"]
    else:
        pytest.skip("running as root and no bwrap to become another user with")
    course = _course(tmp_path / "course")
    python = borrowing_venv(course / ".venv")
    p, results = _grade(python, course, "solutions/", user=user)
    _held_100(p, results)


def test_an_interpreter_path_through_the_course_folder(tmp_path):
    """Issue 38: ``cd exercises && ../.venv/bin/python -m grader ex01_leakage.ipynb`` gave every
    exercise "grader error" (bwrap could not exec a path through the course, which the sandbox
    does not show) and told the user to install bubblewrap. The path is resolved before it
    reaches the sandbox."""
    exe = Path(sys.executable)
    if not exe.is_relative_to(ROOT):
        pytest.skip("the venv is not inside the course")
    relative = os.path.relpath(exe, ROOT / "exercises")  # ../.venv/bin/python
    out = tmp_path / "r.json"
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SEED", "VIRTUAL_ENV")}
    p = subprocess.run([relative, "-m", "grader", "ex01_leakage.ipynb", "--quiet", "--json", str(out)],
                       env={**base, "COLUMNS": "1000"}, capture_output=True, text=True, timeout=600,
                       cwd=ROOT / "exercises")
    assert "student code was not run" not in p.stdout + p.stderr, p.stderr[-2000:]
    results = json.loads(out.read_text())
    assert "grader error" not in results["extra_data"]["status"].values(), results["extra_data"]["status"]


def test_bwrap_that_cannot_start_python_is_not_told_to_install_bubblewrap():
    from grader.sandbox import allowlist

    said = allowlist.startup_refusal("bwrap: execvp /c/exercises/../.venv/bin/python: No such file")
    assert "bwrap could not start Python" in said and "apt-get install bubblewrap" not in said
    assert "bubblewrap is installed and runs" in said


def test_a_sandbox_that_shows_the_course_refuses_and_names_the_path(tmp_path):
    """A path the worker must not see (here a report file's folder) inside a folder the sandbox
    shows: no grade, the path in the message, and a non-zero exit, so that `&&` stops."""
    shown = Path(sys.executable).parent  # the interpreter's own folder: always shown
    marker = tmp_path / "ran.py"
    marker.write_text("_ = print('STUDENT CODE RAN', flush=True)\n"
                      "def causal_mask(L, device=None):\n    raise NotImplementedError\n")
    p, results = _grade(Path(sys.executable), ROOT, str(marker), "--hide", str(shown))
    assert p.returncode != 0
    assert "STUDENT CODE RAN" not in p.stdout + json.dumps(results)
    text = " ".join((p.stdout + p.stderr).split())
    assert f"the sandbox did not hold (it sees 1 of the course's or the grading's own paths, {shown}" in text
    assert "Fix: the sandbox shows the interpreter's own folders" in text
    assert results["extra_data"]["status"] == {"causal_mask": "grader error"}


def test_class_mode_marks_a_refused_grading_not_graded_and_grades_it_again(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "honest.py").write_text((SUBMISSIONS / "correct.py").read_text())
    out = tmp_path / "out"
    shown = str(Path(sys.executable).parent)
    rows = grade_class(subs, out, jobs=1, seed=5, progress=False, preload=False,
                       extra=["--exercise", "causal_mask", "--hide", shown])
    (row,) = rows
    assert row.status == "not graded" and row.isolation.startswith("NOT HELD"), row
    assert shown in row.message
    grades = (out / "grades.csv").read_text().splitlines()
    assert grades[1].startswith("honest,,") and ",,not graded," in grades[1], grades  # no points, not 0
    rows = grade_class(subs, out, jobs=1, seed=5, progress=False, preload=False,
                       extra=["--exercise", "causal_mask", "--hide", shown])
    assert not rows[0].skipped and rows[0].status == "not graded"  # tried again, not "unchanged"
