"""The classroom workflows: valid, pointing at things that exist, and the student template's
steps run here exactly as written (the same `run:` scripts, in a built template repository)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnmask import CONTRACT
from grader.__main__ import SUBCOMMANDS
from grader.runners.classmode import classroom
from grader.runners.platforms import classroom50_publish, github, repos

REPO = Path(__file__).resolve().parent.parent
STUDENT = REPO / "classroom" / "github" / ".github" / "workflows" / "classroom.yml"
INSTRUCTOR = REPO / "classroom" / "instructor" / ".github" / "workflows" / "grade-class.yml"


def _load(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    assert isinstance(wf, dict) and "on" in wf, f"{path}: no trigger (is `on` quoted?)"
    return wf


def _steps(wf: dict) -> list[dict]:
    (job,) = wf["jobs"].values()
    return job["steps"]


def _commands(script: str) -> list[list[str]]:
    """Simple commands of a bash script: lines joined at backslashes, split at ||, &&, ;, |."""
    out: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for tok in lexer:
            if tok in ("||", "&&", ";", "|", "&"):
                if words:
                    out.append(words)
                words = []
            else:
                words.append(tok)
        if words:
            out.append(words)
    return out


def _engine_flags() -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "grader", "--help"], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return set(re.findall(r"--[a-z][a-z-]*", proc.stdout))


def test_student_workflow_runs_the_public_checks_on_every_push():
    wf = _load(STUDENT)
    assert "push" in wf["on"]
    steps = _steps(wf)
    setup = next(s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python"))
    assert setup["with"]["cache"] == "pip" and setup["with"]["cache-dependency-path"] == "requirements.txt"
    assert setup["with"]["python-version"] == "3.11"
    ids = {s["id"]: s for s in steps if "id" in s}
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert "results.json" in upload["with"]["path"]
    assert any("GITHUB_STEP_SUMMARY" in s.get("run", "") for s in steps)
    grade = ids["grade"]["run"]
    assert "--public-only" in grade and "exercises/" in grade and "GRADER_SEED" not in STUDENT.read_text()
    # GitHub Classroom, retired on 2026-08-28, recorded what its reporter posted; nothing does now
    assert "autograding-grading-reporter" not in STUDENT.read_text()


@pytest.mark.parametrize("path", [STUDENT, INSTRUCTOR], ids=["student", "instructor"])
def test_every_run_command_refers_to_things_that_exist(path, tmp_path):
    template = github.build_template(REPO, tmp_path / "template")
    engine_flags = _engine_flags()
    for step in _steps(_load(path)):
        for words in _commands(step.get("run", "")):
            if words[0] != "python":
                continue
            assert words[1] == "-m", words
            module = words[2]
            rest = words[3:]
            if module == "pip":
                reqs = rest[rest.index("-r") + 1]
                assert (template / reqs).is_file() and (REPO / reqs).is_file(), reqs
            elif module == "grader" and rest[0] == "class":
                classroom.build_parser().parse_args(rest[1:])  # valid class-mode arguments
            elif module == "grader" and rest[0] == "repos" and path == INSTRUCTOR:
                args = rest[1:]
                args = args[:next((i for i, w in enumerate(args) if w in (">", "<", ">>")), len(args))]
                repos.build_parser().parse_args(args)  # valid arguments (listing needs GitHub)
            elif module == "grader" and rest[:2] == ["classroom50", "publish"] and path == INSTRUCTOR:
                classroom50_publish.build_parser().parse_args(rest[2:])  # valid (publishing needs GitHub)
            elif module == "grader" and rest[0] in SUBCOMMANDS:
                assert rest[0] in ("gh-outputs", "template"), rest  # what a student's workflow may run
            elif module == "grader":
                assert (template / rest[0]).is_dir(), rest[0]
                flags = {w for w in rest if w.startswith("--")}
                assert flags <= engine_flags, f"the engine's CLI has no {flags - engine_flags}"
            else:
                raise AssertionError(f"{path.name} runs an unexpected module: {words}")


def _run_steps(repo: Path, tmp: Path) -> tuple[str, Path]:
    """Run the student workflow's `run:` steps (install excepted) in ``repo`` with
    GitHub's default shell, `bash -e`; returns the job summary and the results.json."""
    gh_output, gh_summary = tmp / "github_output", tmp / "step_summary"
    gh_output.touch()
    gh_summary.touch()
    # `python` in the steps is this interpreter, first on the PATH, as actions/setup-python
    # makes it: the test must not depend on what else the PATH holds (a venv not activated).
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a script, not a symlink: a venv's python finds its venv by its own path
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "GITHUB_OUTPUT": str(gh_output), "GITHUB_STEP_SUMMARY": str(gh_summary),
           "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    for step in _steps(_load(STUDENT)):
        if "run" not in step or step.get("id") == "install":
            continue
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"step {step['name']!r} failed:\n{proc.stdout}\n{proc.stderr}"
    return gh_summary.read_text(), repo / "results.json"


@pytest.mark.slow
def test_steps_run_locally_on_a_half_finished_repository(tmp_path):
    """The student has finished chapters 1-3 and not started 4-7."""
    repo = github.build_template(REPO, tmp_path / "student-repo")
    done = ("ex01_leakage.ipynb", "ex02_softmax.ipynb", "ex03_padding.ipynb")
    for name in done:
        shutil.copy2(REPO / "solutions" / name, repo / "exercises" / name)
    summary, results = _run_steps(repo, tmp_path)
    data = json.loads(results.read_text())
    by_name = {t["name"].split()[0]: t for t in data["tests"]}
    assert len(by_name) == len(CONTRACT)  # every exercise of the contract, done or not
    finished = {"causal_mask", "influence_matrix", "find_leaking_layer", "to_additive", "masked_softmax",
                "attention", "padding_mask", "padded_encoder"}
    for name, t in by_name.items():
        if name in finished:
            assert t["score"] == t["max_score"] > 0, t
        else:
            assert t["score"] == 0 and "not implemented" in t["output"].lower(), t
    points = sum(t["score"] for t in data["tests"])
    assert points == data["score"] and 0 < points < data["max_score"]
    assert "causal_mask" in summary and "document_mask" in summary


def test_the_class_is_graded_as_root_so_student_code_runs_as_another_user():
    """On a hosted runner the grader can hide the seed and the course from student code
    only as root; the results it writes for root alone go back to the runner's user."""
    steps = _steps(_load(INSTRUCTOR))
    grade = next(s for s in steps if s.get("id") == "grade")
    assert grade["run"].startswith("sudo --preserve-env=GRADER_SEED") and "-m grader class" in grade["run"]
    after = steps[steps.index(grade) + 1]
    assert "chown" in after["run"] and after.get("if") == "always()"
