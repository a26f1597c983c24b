"""GitHub Classroom: the reporter's ``result`` output and the student template repository.

``python -m grader gh-outputs results.json`` turns a results.json into the
base64 ``result`` output that GitHub Classroom's ``autograding-grading-reporter``
action reads; ``python -m grader template DEST`` builds the student template
repository with its workflow (both dispatched from :mod:`grader.runners.classroom`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .scores import _fmt, max_score, read_results, total_score

# --------------------------------------------------------------------------- GitHub Classroom


def classroom_result(results: dict[str, Any] | None, *, missing: str = "") -> dict[str, Any]:
    """Gradescope results.json -> the JSON that ``autograding-grading-reporter`` reads.

    The reporter sums ``tests[].score`` against the top-level ``max_score`` and posts
    "Points X/Y" for GitHub Classroom; a test is ``pass`` only at full marks.
    """
    if results is None:
        message = missing or "the grader wrote no results.json"
        return {"version": 1, "status": "error", "max_score": 0,
                "tests": [{"name": "grader", "status": "error", "score": 0, "message": message,
                           "test_code": "", "filename": "", "line_no": 0, "execution_time": ""}]}
    tests = []
    for t in results.get("tests", []):
        score, top = float(t.get("score", 0) or 0), float(t.get("max_score", 0) or 0)
        tests.append({"name": str(t.get("name", "")), "status": "pass" if score >= top else "fail",
                      "score": score, "message": str(t.get("output", ""))[:4000], "test_code": "",
                      "filename": "", "line_no": 0, "execution_time": ""})
    if not tests:  # e.g. a corrupt notebook: one failing entry that says why
        tests.append({"name": "submission", "status": "fail", "score": total_score(results),
                      "message": str(results.get("output", "nothing was graded")), "test_code": "",
                      "filename": "", "line_no": 0, "execution_time": ""})
    top = max_score(results) or 0.0
    status = "pass" if tests and all(t["status"] == "pass" for t in tests) else "fail"
    return {"version": 1, "status": status, "max_score": top, "tests": tests}


def gh_outputs_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m grader gh-outputs",
        description="Write the base64 `result` output for classroom-resources/autograding-grading-reporter "
                    "from a results.json (to $GITHUB_OUTPUT when set, and to stdout).")
    p.add_argument("results", type=Path)
    p.add_argument("--github-output", type=Path, default=os.environ.get("GITHUB_OUTPUT") or None,
                   help="file to append `result=...` to (default: $GITHUB_OUTPUT)")
    args = p.parse_args(argv)
    results = read_results(args.results)
    payload = classroom_result(results, missing=f"{args.results} is missing or not valid JSON: the grader "
                                                f"did not finish (see the grading step's log)")
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    line = f"result={encoded}"
    if args.github_output is not None:
        with open(args.github_output, "a") as fh:
            fh.write(line + "\n")
    print(line)
    total = sum(t["score"] for t in payload["tests"])
    print(f"Points {_fmt(total)}/{_fmt(payload['max_score'])}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- template repo

#: What a student's template repository holds. No solutions/, no tests/, no book/. Its README.md
#: (for students: the course's is for maintainers) and workflow come from classroom/github/.
TEMPLATE_PATHS = ("exercises", "attnmask", "grader", "pyproject.toml")
#: Development tools in requirements.txt that grading never imports, and what only executing the
#: book needs (transformers, for chapters 9 and 10); left out of the student template and the
#: Gradescope image, which install on every run or build.
DEV_ONLY = {"jupyter-book", "nbval", "pytest", "pytest-xdist", "pytest-timeout", "pytest-benchmark",
            "hypothesis", "ruff", "transformers"}


#: What students need to work in notebooks but grading does not (the Gradescope image).
NOTEBOOK_ONLY = {"jupyterlab", "nbformat", "nbclient", "ipykernel", "pyyaml", "matplotlib"}


def runtime_requirements(text: str, *, keep_editable: bool = True, grading_only: bool = False) -> str:
    """requirements.txt without the development-only tools (pins kept verbatim); with
    ``grading_only``, also without what only working in notebooks needs."""
    out = []
    drop = DEV_ONLY | NOTEBOOK_ONLY if grading_only else DEV_ONLY
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        name = m.group(1).lower().replace("_", "-").replace(".", "-") if m else None
        if name in drop:
            continue
        if line.strip().startswith("-e") and not keep_editable:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def build_template(repo: Path, dest: Path) -> Path:
    """Copy what the student template repository needs, plus the ready workflow."""
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty; expected a new or empty folder for the template repository.")
    for rel in TEMPLATE_PATHS:
        src = repo / rel
        if not src.exists():
            raise SystemExit(f"{src} is missing; expected the course repository at {repo} "
                             f"(run this from the repository root).")
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                           ".ipynb_checkpoints"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "requirements.txt").write_text(runtime_requirements((repo / "requirements.txt").read_text()))
    shutil.copytree(repo / "classroom" / "github", dest, dirs_exist_ok=True)
    return dest


def template_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader template",
                                description="Build the GitHub Classroom student template repository.")
    p.add_argument("dest", type=Path)
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    args = p.parse_args(argv)
    build_template(args.repo, args.dest)
    print(f"template repository written to {args.dest}: {', '.join(TEMPLATE_PATHS)}, requirements.txt, "
          f"README.md, .github/workflows/classroom.yml")
    return 0
