"""``python -m grader``: one command; a subcommand, when one is named first, picks the runner.

    python -m grader SUBMISSION [...]        grade one submission      (grader.runners.cli)
    python -m grader class SUBMISSIONS OUT   grade a class             (grader.runners.classroom)
    python -m grader merge OUT... --out DIR  merge a sharded class    (grader.runners.merge)
    python -m grader repos list ORG PREFIX   an assignment's repositories, all of them  (grader.runners.repos)
    python -m grader release [--check]       write exercises/ from solutions/  (grader.runners.release)
    python -m grader gradescope build DIR    the Gradescope bundle     (grader.runners.gradescope)
    python -m grader template DEST           GitHub Classroom's template repository (grader.runners.github)
    python -m grader gh-outputs RESULTS      GitHub Classroom's outputs  (grader.runners.github)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("class", "merge", "repos", "release", "gradescope", "template", "gh-outputs")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name == "class":
        from .runners.classroom import main as run
    elif name == "merge":
        from .runners.merge import main as run
    elif name == "repos":
        from .runners.repos import main as run
    elif name == "release":
        from .runners.release import main as run
    elif name == "gradescope":
        from .runners.gradescope import main as run
    elif name == "template":
        from .runners.github import template_main as run
    elif name == "gh-outputs":
        from .runners.github import gh_outputs_main as run
    else:
        from .runners.cli import main as run

        rest = argv
    return run(rest)


if __name__ == "__main__":
    code = main()
    # Every report is written and closed and every worker reaped by now: skip tearing torch
    # down at exit, which costs about half a second (as long as a grading's own work).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
