"""The student template repository, and the retired GitHub Classroom's reporter output.

GitHub Classroom was retired on 2026-08-28 (Classroom 50, :mod:`.classroom50`, is its
successor). ``python -m grader gh-outputs results.json`` still turns a results.json into the
base64 ``result`` output that its ``autograding-grading-reporter`` action reads, for
repositories that keep that workflow; ``python -m grader template DEST`` builds the student template
repository with its workflow (both dispatched from :mod:`grader.runners.classmode.classroom`).
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

from ..classmode.scores import _fmt, max_score, read_results, total_score

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

#: What a student's template repository holds. No solutions/, no tests/, no book/, and no reference:
#: neither ``attnmask`` nor the chapters' check modules (``grader/checks/chN_*.py`` and ``chN_*/``,
#: whose recognisers compute the classic mistakes from the answer); the public checks come as data,
#: recorded at release (``grader/data/public_checks/``). Its README.md (for students: the course's is
#: for maintainers) and workflow come from classroom/github/; its pyproject.toml and .gitignore are
#: written here.
TEMPLATE_PATHS = ("exercises", "grader")
#: Left out of every copied folder.
TEMPLATE_IGNORE = ("__pycache__", "*.pyc", ".ipynb_checkpoints", "ch[0-9]*_*")


def template_ignore(folder: str, names: list[str]) -> set[str]:
    """What a student template leaves out of ``grader/``: TEMPLATE_IGNORE's patterns, and every
    module that imports the reference (``attnmask``): the chapters' checks and the modules they
    keep their cases and recognisers in. The template grades from recorded data without them."""
    left = set(shutil.ignore_patterns(*TEMPLATE_IGNORE)(folder, names))
    for name in names:
        path = Path(folder) / name
        if name.endswith(".py") and path.is_file() and _REFERENCE.search(path.read_text(errors="replace")):
            left.add(name)
    return left


_REFERENCE = re.compile(r"^(?:import attnmask|from attnmask\b)", re.M)  # at module level
TEMPLATE_PYPROJECT = """\
# The student template of the attention-masking course: the grader with the public checks as
# data. Generated by `python -m grader template`; the course repository's pyproject.toml is the source.
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "attnmask-exercises"
version = "{version}"
description = "Attention-masking exercises and their public checks."
requires-python = ">=3.10"
dependencies = ["torch>=2.5,<3", "numpy", "rich"]

[tool.setuptools.packages.find]
include = ["grader*"]

[tool.setuptools.package-data]
grader = ["data/public_checks/*", "templates/gradescope/*"]
"""
TEMPLATE_GITIGNORE = """\
# Python, Jupyter and the grader's outputs: only your notebooks need committing.
__pycache__/
*.pyc
.ipynb_checkpoints/
.venv/
venv/
*.egg-info/
build/
results.json
summary.md
grades/
"""
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
    out: list[str] = []
    notes: list[str] = []  # the comment lines just above a requirement: they go (or stay) with it
    drop = DEV_ONLY | NOTEBOOK_ONLY if grading_only else DEV_ONLY
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            notes.append(line)
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        name = m.group(1).lower().replace("_", "-").replace(".", "-") if m else None
        dropped = name in drop or (line.strip().startswith("-e") and not keep_editable)
        if not dropped:
            out += notes + [line]
        notes = []
    return "\n".join(out + notes) + "\n"


def build_template(repo: Path, dest: Path) -> Path:
    """Copy what the student template repository needs, plus the ready workflow."""
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty; expected a new or empty folder for the template repository.")
    if not (repo / "grader" / "data" / "public_checks" / "index.json").is_file():
        raise SystemExit(f"{repo}/grader/data/public_checks/ is missing: run `python -m grader release` "
                         "first (it records the public checks the template grades with).")
    for rel in TEMPLATE_PATHS:
        src = repo / rel
        if not src.exists():
            raise SystemExit(f"{src} is missing; expected the course repository at {repo} "
                             f"(run this from the repository root).")
        shutil.copytree(src, dest / rel, ignore=template_ignore)
    version = re.search(r'^version = "([^"]+)"', (repo / "pyproject.toml").read_text(), re.M)
    pyproject = TEMPLATE_PYPROJECT.format(version=version.group(1) if version else "0")
    (dest / "pyproject.toml").write_text(pyproject)
    (dest / ".gitignore").write_text(TEMPLATE_GITIGNORE)
    (dest / "requirements.txt").write_text(runtime_requirements((repo / "requirements.txt").read_text()))
    shutil.copytree(repo / "classroom" / "github", dest, dirs_exist_ok=True)
    return dest


def template_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader template",
                                description="Build the student template repository.")
    p.add_argument("dest", type=Path)
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[3])
    args = p.parse_args(argv)
    build_template(args.repo, args.dest)
    print(f"template repository written to {args.dest}: {', '.join(TEMPLATE_PATHS)} (the public checks as "
          "data, no reference), pyproject.toml, requirements.txt, README.md, .gitignore, "
          ".github/workflows/classroom.yml")
    return 0
