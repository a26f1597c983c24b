"""``python -m grader``: one command; a subcommand, when one is named first, picks the runner.

The runner of each, under ``grader.runners``:

    python -m grader SUBMISSION [...]        grade one submission                single.cli
    python -m grader release [--check]       write exercises/ from solutions/    single.release
    python -m grader class SUBMISSIONS OUT   grade a class                       classmode.classroom
    python -m grader merge OUT... --out DIR  merge a sharded class               classmode.merge
    python -m grader repos list ORG PREFIX   an assignment's repositories        platforms.repos
    python -m grader gradescope build DIR    the Gradescope bundle               platforms.gradescope
    python -m grader template DEST           GitHub Classroom's template         platforms.github
    python -m grader gh-outputs RESULTS      retired GitHub Classroom's outputs  platforms.github
    python -m grader classroom50 build OUT   Classroom 50's autograder folder    platforms.classroom50
    python -m grader classroom50 publish DIR grades into its gradebook           platforms.classroom50_publish
    python -m grader export --format F       a gradebook import file             platforms.export
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("class", "merge", "repos", "release", "gradescope", "template", "gh-outputs", "classroom50",
               "export")


def unrelated_grader() -> str | None:
    """A warning when an unrelated distribution named ``grader`` (PyPI's, 2012) is installed: this
    grader comes with the course's ``attnmask`` distribution, and ``pip install grader`` gets the
    other one, whose ``import grader`` may shadow this one."""
    from importlib import metadata

    try:
        other = metadata.distribution("grader")
    except metadata.PackageNotFoundError:
        return None
    return (f"warning: an unrelated package named 'grader' ({other.metadata.get('Name', 'grader')} "
            f"{other.version}) is installed in this Python; the course's grader comes with its package "
            "attnmask, not with `pip install grader`. Remove the other one: pip uninstall grader")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    clash = unrelated_grader()
    if clash:
        print(clash, file=sys.stderr)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name == "class":
        from .runners.classmode.classroom import main as run
    elif name == "merge":
        from .runners.classmode.merge import main as run
    elif name == "repos":
        from .runners.platforms.repos import main as run
    elif name == "release":
        from .runners.single.release import main as run
    elif name == "gradescope":
        from .runners.platforms.gradescope import main as run
    elif name == "template":
        from .runners.platforms.github import template_main as run
    elif name == "gh-outputs":
        from .runners.platforms.github import gh_outputs_main as run
    elif name == "classroom50":
        from .runners.platforms.classroom50_publish import command as run
    elif name == "export":
        from .runners.platforms.export import main as run
    else:
        typo = _not_a_subcommand(name)
        if typo:
            print(f"python -m grader: error: {typo}", file=sys.stderr)
            return 2
        from .runners.single.cli import main as run

        rest = argv
    return run(rest)


def _not_a_subcommand(word: str) -> str | None:
    """What is wrong with a first word that is no path and close to a subcommand (``clas``), else None.

    A word with a dot or a slash, or far from every subcommand, is a path, and the grader's own CLI
    says if it is missing."""
    if not word or word.startswith("-") or any(c in word for c in "./" + os.sep) or os.path.exists(word):
        return None
    import difflib

    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.6)
    if not close:
        return None  # a path after all: the CLI says that it does not exist
    return (f"{word!r} is neither a subcommand nor a file or folder to grade; did you mean "
            f"`python -m grader {close[0]}`? The subcommands are "
            f"{', '.join(SUBCOMMANDS)}; to grade, pass a notebook, a .py file or a folder "
            f"(`python -m grader exercises/`)")


if __name__ == "__main__":
    code = main()
    # Every report is written and closed and every worker reaped by now: skip tearing torch
    # down at exit, which costs about half a second (as long as a grading's own work).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
