"""The Classroom 50 autograder, run as Classroom 50's runner runs it.

The runner (foundation50/classroom50, ``runner.py``) extracts the assignment's folder,
then runs ``python autograder.py`` with the working folder at the student's checkout and
its environment: ``CLASSROOM``, ``ASSIGNMENT``, ``SUBMISSION_TAG``, ``GITHUB_*``, plus
``USERNAME``, ``OWNER``, ``ASSIGNMENT_TYPE``, ``COMMIT_URL``, ``RELEASE_URL``, ``REVIEW_URL``
and ``CLASSROOM50_BUNDLE_DIR``. It then reads ``result.json``, ``release-body.md`` and the
``status=``/``summary=`` lines of ``$GITHUB_OUTPUT``; exit 0 means that grading ran.

The rules of ``result.json`` (schema ``classroom50/result/v1``) are written below as facts,
from the schema's text and the runner's ``validate_result``; their file is not copied.
Here ``import attnmask`` fails, as on a student's runner.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from buggy import mistakes

from grader import engine
from grader.report import checks_lines
from grader.runners.platforms import classroom50
from grader.runners.single.notebook import run_public

REPO = Path(__file__).resolve().parents[1]
#: The course's whole points, as Classroom 50 posts them: the registry's points apportioned.
WHOLE = dict(zip(engine.load_registry(), classroom50.whole_points(
    [spec.points for spec in engine.load_registry().values()])))
TOTAL = sum(WHOLE.values())
SECRET_SEED = "314159265358979323846264338327950288"
CLASSROOM, ASSIGNMENT, USER = "ml-fall", "attention-masks", "ada-l"

# --------------------------------------------------------------------------- the schema, as facts

REQUIRED = {"schema", "classroom", "assignment", "assignment_type", "owner", "submission", "commit",
            "release", "review", "datetime", "score", "max-score", "tests"}
OPTIONAL = {"graded_at", "submitted_by"}  # graded_at: when this grading ran; no other key is allowed
TEST_REQUIRED = {"test-name", "passed", "score", "max-score"}  # a test may carry more (its feedback)
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ$")


def _count(x) -> bool:
    """A non-negative integer, and not a bool (which Python counts as an int)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def schema_problems(result, env) -> list[str]:
    """Every rule of classroom50/result/v1 that ``result`` breaks, for the submission in ``env``."""
    bad = []
    if not isinstance(result, dict):
        return ["not a JSON object"]
    bad += [f"missing {k}" for k in sorted(REQUIRED - result.keys())]
    bad += [f"key not allowed: {k}" for k in sorted(result.keys() - REQUIRED - OPTIONAL)]
    if result.get("schema") != "classroom50/result/v1":
        bad.append("schema")
    for key, want in (("classroom", env["CLASSROOM"]), ("assignment", env["ASSIGNMENT"]), ("owner", USER)):
        if not isinstance(result.get(key), str) or result.get(key) != want:
            bad.append(f"{key} is {result.get(key)!r}, want {want!r}")
    if result.get("assignment_type") not in ("individual", "group", "team"):  # runner.py's three modes
        bad.append("assignment_type")
    if not isinstance(result.get("submission"), str) or not result["submission"].startswith("submit/"):
        bad.append("submission must be a submit/* tag")
    for key in ("commit", "release", "review", "datetime"):
        if not isinstance(result.get(key), str) or not result[key]:
            bad.append(f"{key} must be a non-empty string")
    if not DATETIME.match(str(result.get("datetime", ""))):
        bad.append("datetime must be YYYY-MM-DDTHH:MM:SSZ")
    if not (_count(result.get("score")) and _count(result.get("max-score"))):
        bad.append("score and max-score must be non-negative integers")
    elif result["score"] > result["max-score"]:
        bad.append("score > max-score")
    tests = result.get("tests")
    if not isinstance(tests, list):
        return [*bad, "tests is not a list"]
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or TEST_REQUIRED - t.keys():
            bad.append(f"tests[{i}] lacks {sorted(TEST_REQUIRED - set(t or ()))}")
            continue
        if not isinstance(t["test-name"], str) or not t["test-name"]:
            bad.append(f"tests[{i}].test-name")
        if not isinstance(t["passed"], bool):
            bad.append(f"tests[{i}].passed")
        if not (_count(t["score"]) and _count(t["max-score"])) or t["score"] > t["max-score"]:
            bad.append(f"tests[{i}] score {t['score']!r} of {t['max-score']!r}")
    return bad


def test_the_schema_facts_can_fail():
    """The checker itself: a valid result passes, and each broken rule is caught."""
    env = runner_env(Path("/dev/null"))
    good = {"schema": "classroom50/result/v1", "classroom": CLASSROOM, "assignment": ASSIGNMENT,
            "assignment_type": "individual", "owner": USER,
            "submission": "submit/2026-11-01T10-00-00Z-abc1234",
            "commit": "c", "release": "r", "review": "v", "datetime": "2026-11-01T10:00:00Z", "score": 3,
            "max-score": 3, "tests": [{"test-name": "t", "passed": True, "score": 3, "max-score": 3}]}
    assert schema_problems(good, env) == []
    for broken in ({"score": 3.0}, {"score": True}, {"score": 4}, {"extra": 1}, {"datetime": "2026-11-01"},
                   {"submission": "v1"},
                   {"tests": [{"test-name": "t", "passed": 1, "score": 0, "max-score": 1}]},
                   {"tests": [{"test-name": "t", "passed": False, "score": 2, "max-score": 1}]}):
        assert schema_problems({**good, **broken}, env), broken


# --------------------------------------------------------------------------- the folder and its run


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    os.environ["GRADER_SEED"] = SECRET_SEED  # a build must not pick up a seed it was never meant to hold
    try:
        return classroom50.build(REPO, tmp_path_factory.mktemp("config"), ASSIGNMENT)
    finally:
        del os.environ["GRADER_SEED"]


def runner_env(checkout: Path, *, bundle: Path | None = None) -> dict[str, str]:
    repo = f"{CLASSROOM}-{ASSIGNMENT}-{USER}"
    tag = "submit/2026-11-01T10-00-00Z-abc1234"
    base = f"https://github.com/ml-org/{repo}"
    env = {k: v for k, v in os.environ.items() if k not in ("GRADER_SEED", "PYTHONPATH")}
    env.update(CLASSROOM=CLASSROOM, ASSIGNMENT=ASSIGNMENT, SUBMISSION_TAG=tag, MODE="individual",
               PAGES_BASE_URL="https://ml-org.github.io/classroom50", GITHUB_REPOSITORY=f"ml-org/{repo}",
               GITHUB_SHA="abc1234" * 5 + "ab", GITHUB_SERVER_URL="https://github.com", GITHUB_ACTOR=USER,
               GITHUB_OUTPUT=str(checkout.parent / "github_output"), USERNAME=USER, OWNER=USER,
               ASSIGNMENT_TYPE="individual", COMMIT_URL=f"{base}/commit/abc",
               RELEASE_URL=f"{base}/releases/tag/x", REVIEW_URL=f"{base}/compare/a...b")
    if bundle is not None:
        env["CLASSROOM50_BUNDLE_DIR"] = str(bundle)
    return env


def run_autograder(bundle: Path, checkout: Path) -> tuple[subprocess.CompletedProcess, dict, str, str]:
    """``python autograder.py`` in the checkout, as the runner does; where ``import attnmask`` fails."""
    blocker = checkout.parent / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "attnmask.py").write_text("raise ImportError('attnmask is not on a student runner')\n")
    env = runner_env(checkout, bundle=bundle)
    env["PYTHONPATH"] = str(blocker)
    (checkout.parent / "github_output").write_text("")
    proc = subprocess.run([sys.executable, str(bundle / "autograder.py")], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    written = checkout / "result.json"
    result = json.loads(written.read_text()) if written.exists() else None
    body = (checkout / "release-body.md").read_text() if (checkout / "release-body.md").exists() else ""
    return proc, result, body, (checkout.parent / "github_output").read_text()


def student_checkout(root: Path, notebooks: dict[str, str] | None = None, *,
                     copy_solutions: bool = False) -> Path:
    """A student's repository as checked out: exercises/, and a grader/ the student may have edited."""
    checkout = root / "checkout"
    (checkout / "exercises").mkdir(parents=True)
    if copy_solutions:
        for nb in (REPO / "solutions").glob("ex*.ipynb"):
            shutil.copy(nb, checkout / "exercises" / nb.name)
    for name, text in (notebooks or {}).items():
        (checkout / "exercises" / name).write_text(text)
    forged = checkout / "grader"
    forged.mkdir()
    (forged / "__init__.py").write_text(f"open({str(root / 'FORGED')!r}, 'w').write('imported')\n")
    return checkout


def test_the_folder_is_public_small_and_holds_no_reference(bundle):
    files = [f for f in bundle.rglob("*") if f.is_file()]
    assert (bundle / "autograder.py").is_file() and (bundle / "grader" / "data" / "public_checks").is_dir()
    assert not list(bundle.rglob("attnmask*")) and not list(bundle.rglob("ch[0-9]*_*.py"))
    assert all(SECRET_SEED.encode() not in f.read_bytes() for f in files)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:  # the runner fetches it as a .tar.gz
        tar.add(bundle, arcname=ASSIGNMENT)
    assert sum(f.stat().st_size for f in files) <= classroom50.BUNDLE_CAP
    assert len(packed.getvalue()) <= classroom50.BUNDLE_CAP


@pytest.mark.slow
def test_a_correct_submission(bundle, tmp_path):
    checkout = student_checkout(tmp_path, copy_solutions=True)
    proc, result, body, outputs = run_autograder(bundle, checkout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert schema_problems(result, runner_env(checkout)) == []
    assert (result["score"], result["max-score"]) == (TOTAL, TOTAL)
    assert all(t["passed"] for t in result["tests"]) and len(result["tests"]) == len(engine.load_registry())
    assert f"### Public checks: {TOTAL} / {TOTAL}" in body
    assert outputs.splitlines()[0] == "status=success" and outputs.splitlines()[1].startswith("summary=")
    assert not (tmp_path / "FORGED").exists()  # the folder's grader ran, not the checkout's


BUGGY = {"mine.py": "import torch\n\n\ndef causal_mask(n, *, device=None):\n"
                    "    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)\n"}


@pytest.mark.slow
def test_a_buggy_submission_gets_the_feedback_check_gives(bundle, tmp_path):
    checkout = student_checkout(tmp_path, BUGGY)
    proc, result, body, outputs = run_autograder(bundle, checkout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert schema_problems(result, runner_env(checkout)) == []
    (mask,) = [t for t in result["tests"] if t["test-name"].startswith("causal_mask ")]
    assert not mask["passed"] and mask["score"] < mask["max-score"] == WHOLE["causal_mask"]
    assert result["score"] == sum(t["score"] for t in result["tests"]) < WHOLE["causal_mask"]
    assert result["max-score"] == TOTAL
    # the feedback check() prints for the same function, line by line, in the release body
    shown = checks_lines(run_public(mistakes.causal_no_diagonal, "causal_mask"))
    assert shown and all(line in body for line in shown)
    assert "status=failure" in outputs.splitlines()
    assert not (tmp_path / "FORGED").exists()


@pytest.mark.slow
@pytest.mark.parametrize("handed_in", ["stubs", "nothing"])
def test_an_empty_submission_scores_zero_and_grading_still_ran(bundle, tmp_path, handed_in):
    stubs = {nb.name: nb.read_text() for nb in (REPO / "exercises").glob("ex*.ipynb")}
    checkout = student_checkout(tmp_path, stubs if handed_in == "stubs" else None)
    proc, result, body, outputs = run_autograder(bundle, checkout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert schema_problems(result, runner_env(checkout)) == []
    assert (result["score"], result["max-score"]) == (0, TOTAL)
    assert not any(t["passed"] for t in result["tests"])
    assert "status=failure" in outputs.splitlines()
    assert body.startswith(f"### Public checks: 0 / {TOTAL}")


def test_outside_the_runner_it_says_what_is_missing(bundle, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CLASSROOM", "ASSIGNMENT", "SUBMISSION_TAG")}
    proc = subprocess.run([sys.executable, str(bundle / "autograder.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "CLASSROOM, ASSIGNMENT, SUBMISSION_TAG not set" in proc.stderr
    assert not (tmp_path / "result.json").exists()


class _Exercise:
    def __init__(self, name, score, top, status):
        self.name, self.chapter, self.score, self.max_score, self.status = name, 1, score, top, status
        self.checks, self.notes, self.message = [], [], ""


class _Report:
    def __init__(self, exercises, error=None):
        self.exercises, self.error, self.internal_error = exercises, error, error is not None
        self.score, self.max_score = sum(e.score for e in exercises), sum(e.max_score for e in exercises)
        self.seed, self.checks_kind, self.notes, self.public_only = 1, "public checks", [], True


def test_datetime_is_the_commit_date_and_graded_at_the_grading():
    """Classroom 50's meaning: ``datetime`` is the graded commit's committer date (the runner
    stamps its own over it), ``graded_at`` when this grading ran."""
    report = _Report([_Exercise("causal_mask", 2.5, 2.5, "passed")])
    result = classroom50.result_of(report, runner_env(Path("/dev/null")), now=1_800_000_000,
                                   submitted=1_799_990_000)
    from datetime import datetime, timezone

    def utc(t):
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    assert (result["datetime"], result["graded_at"]) == (utc(1_799_990_000), utc(1_800_000_000))
    assert schema_problems(result, runner_env(Path("/dev/null"))) == []


@pytest.mark.parametrize("given", ["individual", "group", "team"])
def test_the_assignment_type_is_the_runners(given):
    env = {**runner_env(Path("/dev/null")), "ASSIGNMENT_TYPE": given}
    assert classroom50.identity(env)["assignment_type"] == given


def test_the_release_page_shows_one_total():
    """The gradebook's whole points, once; the table below keeps each exercise's exact points."""
    from grader.results import PARTIAL, PASSED

    report = _Report([_Exercise("causal_mask", 2.5, 2.5, PASSED), _Exercise("attention", 1.0, 2.5, PARTIAL)])
    result = classroom50.result_of(report, runner_env(Path("/dev/null")))
    body = classroom50.release_body(result, report)
    assert result["score"] == 4 == sum(t["score"] for t in result["tests"])  # 3.5 -> 4
    assert body.startswith("### Public checks: 4 / 5\n")
    assert len(re.findall(r"\d+(\.\d+)? / \d+(\.\d+)?\s*$", body.split("| exercise")[0], re.M)) == 1
    assert "## Grader:" not in body


def test_a_failure_inside_the_grader_is_a_graded_zero_with_its_reason():
    """``status=error`` would publish no Release, so collect-scores would never see the submission."""
    report = _Report([_Exercise("causal_mask", 0.0, 2.5, "grader error")], error="the sandbox did not start")
    result = classroom50.result_of(report, runner_env(Path("/dev/null")))
    status, summary = classroom50.status_and_summary(result, report)
    assert status == "failure" and result["score"] == 0
    assert "not graded" in summary and "the sandbox did not start" in summary
    assert "The grader failed on this submission" in classroom50.release_body(result, report)


def test_whole_points_add_up_to_the_course_total():
    """Half points apportioned by largest remainder: the whole points sum to the course total
    (100 once every chapter is in: test_checks_registry holds that), and each exercise gets its
    points rounded down or up, never further."""
    tops = [spec.points for spec in engine.load_registry().values()]
    whole = classroom50.whole_points(tops)
    assert sum(whole) == round(sum(tops))
    assert all(math.floor(t) <= w <= math.ceil(t) for t, w in zip(tops, whole))
    assert classroom50.whole_points([2.5, 2.5, 3.0]) == [3, 2, 3]  # one point left, to the first tie


def test_an_install_that_fails_is_a_graded_zero_not_an_error(tmp_path, monkeypatch):
    """pip cannot install the pin (a runtime's Python torch has no wheel for): exit 0, a valid
    result.json with 0 and the reason, status=failure; an exit 1 would publish no Release."""
    monkeypatch.setattr(classroom50, "_install", lambda bundle: "pip could not install the requirements")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    env = runner_env(checkout)
    (tmp_path / "github_output").write_text("")
    assert classroom50.autograde(tmp_path, workspace=checkout, env=env) == 0
    result = json.loads((checkout / "result.json").read_text())
    assert schema_problems(result, env) == [] and (result["score"], result["tests"]) == (0, [])
    assert "pip could not install" in (checkout / "release-body.md").read_text()
    outputs = (tmp_path / "github_output").read_text()
    assert outputs.startswith("status=failure\nsummary=attention masks: not graded")
