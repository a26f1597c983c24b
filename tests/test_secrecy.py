"""The seed and the reference answers stay out of student code's reach.

``tests/submissions/seeker.py`` looks for them where student code could: every
process's environment, command line and open files, and every readable file
where a course, a class or a report could be (this checkout is as world-readable
as any clone). It prints what it found, reversed, and answers ``causal_mask``
with the reference package if it can load it under another name.

The grader runs student code inside bubblewrap, and leaves it nothing, in every
mode, wherever Python and the virtual environment are installed. Run outside any
sandbox, the seeker finds both: the proof that it works.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader.runners.classmode.classroom import grade_class
from grader.sandbox import bubblewrap

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"
SEED = 918273645512345678  # long enough that no other number on the machine matches it
FOUND = ("NOITULOS NIGEB #", "(ksam_lasuac fed", str(SEED)[::-1])  # reversed, as the seeker prints them
root_only = sandboxed = pytest.mark.skipif(not bubblewrap.available(), reason="needs bubblewrap")


def _grade(tmp_path: Path, python: str = sys.executable) -> tuple[dict, str]:
    env = dict(os.environ)
    env["GRADER_SEED"] = str(SEED)
    env["COLUMNS"] = "1000"  # the terminal report as one line per paragraph
    out = tmp_path / "results.json"
    p = subprocess.run([python, "-m", "grader", str(SUBMISSIONS / "seeker.py"), "--exercise",
                        "causal_mask", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p.stdout


def _seeker_output(text: str) -> str:
    """What the seeker printed, from the grader's terminal report (results.json leaves
    printed output out when hidden cases ran)."""
    assert "SEEKER:" in text, "the seeker did not run"
    return text.split("SEEKER:", 1)[1].split("\n")[0]


@root_only
@pytest.mark.slow
def test_a_single_grading_leaves_the_seeker_nothing(tmp_path):
    results, stdout = _grade(tmp_path)
    seen = _seeker_output(stdout)
    assert not [f for f in FOUND if f in seen], seen[:2000]
    assert results["score"] == 0
    isolation = results["extra_data"]["isolation"]
    assert isolation["seed_protected"] is True and isolation["references_protected"] is True
    assert "warning: not protected" not in stdout
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o600


@pytest.mark.slow
def test_outside_any_sandbox_the_seeker_finds_the_seed(tmp_path):
    """The proof that the seeker works: run in a process of the grader's own, it finds the seed
    in an ancestor's environment."""
    code = ("import runpy, sys; sys.argv = ['seeker']; "
            f"runpy.run_path({str(SUBMISSIONS / 'seeker.py')!r}, run_name='seeker')")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "GRADER_SEED": str(SEED)},
                       capture_output=True, text=True, timeout=280, cwd=tmp_path)
    seen = _seeker_output(p.stdout)
    assert str(SEED)[::-1] in seen, "the seeker cannot find the seed even where it is readable"


@sandboxed
@pytest.mark.slow
def test_a_venv_beside_other_folders_shows_the_sandbox_nothing_of_them(tmp_path, borrowing_venv):
    """The venv lies at X/venv beside X/other, which holds a seed file and a copy of the course:
    the sandbox binds what the interpreter needs of the venv, never the folder around it."""
    base = Path(tempfile.mkdtemp(prefix="grader-nt-"))
    try:
        python = borrowing_venv(base / "venv")
        (base / "other").mkdir()
        (base / "other" / "grader_seed").write_text(f"GRADER_SEED={SEED}\n")
        shutil.copytree(ROOT / "attnmask", base / "other" / "attnmask",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "solutions", base / "other" / "solutions")
        os.chmod(base, 0o755)
        results, stdout = _grade(tmp_path, python=str(python))
        seen = _seeker_output(stdout)
        assert not [f for f in FOUND if f in seen], seen[:2000]
        assert results["score"] == 0 and results["extra_data"]["isolation"]["seed_protected"] is True
    finally:
        shutil.rmtree(base, ignore_errors=True)


@root_only
@pytest.mark.parametrize("preload", [True, False], ids=["forked", "fresh"])
@pytest.mark.slow
def test_class_mode_and_its_regrade_leave_the_seeker_nothing(tmp_path, preload):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "seeker.py").write_text((SUBMISSIONS / "seeker.py").read_text())
    (subs / "honest.py").write_text((SUBMISSIONS / "correct.py").read_text())
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    for regrade in (False, True):  # the second run finds the first run's results, logs and manifest
        rows = grade_class(subs, out, jobs=2, seed=SEED, progress=False, preload=preload, regrade=regrade,
                           extra=["--exercise", "causal_mask"])
        assert {r.slug: r.status for r in rows}.keys() == {"seeker", "honest"}
        assert {r.slug: r.isolation for r in rows} == {"seeker": "held", "honest": "held"}  # as measured
        results = json.loads((out / "seeker" / "results.json").read_text())
        seen = _seeker_output((out / "seeker" / "grader.log").read_text())
        assert not [f for f in FOUND if f in seen], seen[:2000]
        assert results["score"] == 0
        assert json.loads((out / "honest" / "results.json").read_text())["score"] > 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for path in (out / "manifest.json", out / "seeker" / "results.json", out / "seeker" / "grader.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@root_only
def test_gradescope_locks_the_bundles_answers_before_student_code_runs(tmp_path):
    """run_autograder puts the bundle's source first on the path; the reference package
    there becomes root's alone, and nothing outside the autograder is touched."""
    root = tmp_path / "autograder"
    for pkg in ("grader", "attnmask"):
        shutil.copytree(ROOT / pkg, root / "source" / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(root / "source")}
    code = ("import sys; from pathlib import Path; "
            "from grader.runners.platforms.gradescope import _lock_answers; import grader; "
            "assert grader.__file__.startswith(sys.argv[1]); _lock_answers(Path(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", code, str(root)], env=env, cwd=root, check=True)
    assert stat.S_IMODE((root / "source" / "attnmask").stat().st_mode) == 0o700
    assert stat.S_IMODE((ROOT / "attnmask").stat().st_mode) != 0o700  # the course itself: untouched


@pytest.mark.parametrize("length", [40, 299, 301, 2000])
def test_a_hidden_checks_feedback_never_quotes_the_students_own_message(length):
    """Whatever its length, the student's exception text reaches a hidden check's feedback
    not at all, nor its type (issue 38: a type chosen per case says the case); on a public check it
    is quoted as it was."""
    from grader import verdicts
    from grader.checks import EXERCISES
    from grader.spec import Outcome

    said = ("ids " + "1234567 " * 300)[:length]
    checks = EXERCISES["document_mask"].make_checks(3, hidden=True)
    for check in (next(c for c in checks if not c.public), next(c for c in checks if c.public)):
        verdict = verdicts.judge(check, [Outcome(error=f"ValueError: {said}") for _ in check.calls])
        text = verdict.message + verdict.detail
        if check.public:
            assert said[:200] in text
        else:
            assert "ids 1234" not in text and "ValueError" not in text, text
            assert text.startswith(verdicts.RAISED), text


@pytest.mark.slow
def test_hidden_cases_do_not_ride_out_on_what_student_code_says(tmp_path):
    """tests/submissions/exfiltrate.py spells the hidden cases' sizes out in words, in its
    exceptions, its class names and its prints, and prints escapes that draw a fake total:
    none of it reaches results.json (what the student sees), and no escape the terminal."""
    out = tmp_path / "results.json"
    env = {**os.environ, "GRADER_SEED": str(SEED), "COLUMNS": "1000"}
    names = ("causal_mask", "padding_mask", "decoder_mask", "document_mask")
    p = subprocess.run([sys.executable, "-m", "grader", str(SUBMISSIONS / "exfiltrate.py"),
                        "--json", str(out), *(a for name in names for a in ("--exercise", name))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), p.stderr
    results = json.loads(out.read_text())
    assert results["score"] == 0
    hidden = [results["output"]]
    for test in results["tests"]:
        blocks = re.split(r"\n(?=[✓✗–] )", test["output"])
        hidden += [b for b in blocks[1:] if b.split("\n")[0].split(":")[0].endswith("(hidden)")]
        if " (hidden): " in blocks[0]:  # the summary line quotes a hidden check
            hidden.append(blocks[0])
    assert len(hidden) > 6
    # Not even on public checks, in a grading with the seed; --public-only and check(...) quote it in full.
    assert "EXFIL" not in json.dumps(results)
    # A failing hidden check says that it fails, nothing more (issue 46): not that it raised, nor what.
    assert sum("fails on a hidden case" in b for b in hidden) >= 3
    assert not any(re.search(r"ValueError|ForbiddenAPIError", b) for b in hidden), hidden
    assert "EXFIL" in p.stdout  # the operator's terminal shows what it printed, as text
    assert "\x1b" not in p.stdout and "\r" not in p.stdout and "\x1b" not in p.stderr, p.stdout
