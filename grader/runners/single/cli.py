"""``python -m grader SUBMISSION``: grade a notebook, a .py file or a folder of them.

Prints a table (exercise, score, status, first failing property) with a
progress bar while it runs, then feedback on what failed. Optional outputs:
``--json`` (Gradescope results.json), ``--junit`` (JUnit XML), ``--markdown``
(a CI job summary, e.g. ``$GITHUB_STEP_SUMMARY``).

Exit status 0 whenever grading completed, whatever the score; 2 for usage
errors (a path that does not exist, an unknown exercise, bad options); 1 when
the grader itself is broken (its checks do not load). Even then ``--json`` gets
a results file that says what went wrong.

``python -m grader class ...`` grades a whole class (see :mod:`grader.runners.classmode.classroom`); the
other subcommands are listed in :mod:`grader.__main__`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ... import seed as seed_mod
from ...seed import SEED_ENV

USAGE_ERROR = 2
INTERNAL_ERROR = 1


class _Parser(argparse.ArgumentParser):
    """argparse that leaves a results file behind when it rejects the command line."""

    def error(self, message: str) -> NoReturn:
        _json_for_usage_error(sys.argv[1:] if self._argv is None else self._argv, message)
        super().error(message)

    _argv: Sequence[str] | None = None


def _json_for_usage_error(argv: Sequence[str], message: str) -> None:
    path = None
    for i, a in enumerate(argv):
        if a == "--json" and i + 1 < len(argv):
            path = argv[i + 1]
        elif a.startswith("--json="):
            path = a.split("=", 1)[1]
    if path:
        _usage_json(path, message)


def _usage_json(path: str, message: str) -> None:
    """The results file of a grading refused for a usage error (nothing if it cannot be written)."""
    from ...report import failure_json

    try:
        failure_json(f"Not graded, the grader was called wrongly: {message}", path)
    except OSError:
        pass


def build_parser() -> _Parser:
    p = _Parser(
        prog="python -m grader",
        description="Grade attention-masking exercises: a notebook, a .py file, or a folder of them.",
        epilog="Exit status: 0 when grading completed (whatever the score), 2 for usage errors. "
               "Other commands, each with its own --help: `python -m grader class DIR` grades a "
               "whole class; `release`, `gradescope`, `template` and `gh-outputs` are the instructor's.",
    )
    p.add_argument("submission", help="an exercise notebook (.ipynb), a .py file, or a folder of them")
    p.add_argument("--json", metavar="PATH", help="write Gradescope results.json here")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML here")
    p.add_argument("--markdown", metavar="PATH",
                   help="write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--timing", metavar="PATH",
                   help="write where the time went here (wall and CPU seconds per exercise: its checks "
                        "built, run, judged); the instructor's, in no report a student sees")
    p.add_argument("--seed", type=int, default=None,
                   help=f"seed of the hidden cases (default: ${SEED_ENV}, else a fixed seed)")
    p.add_argument("--exercise", action="append", metavar="NAME",
                   help="grade only this exercise (repeatable)")
    p.add_argument("--public-only", action="store_true", help="run only the public checks")
    p.add_argument("--all-exercises", action="store_true",
                   help="grade every exercise of the course whatever a single file holds (those it lacks: "
                        "not found, 0 points); class mode passes it, so every student's maximum is the same")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="time limit per exercise (default 10)")
    p.add_argument("--memory", type=int, default=2048, metavar="MIB",
                   help="memory the submission may use beyond torch's own (default 2048)")
    p.add_argument("--quiet", action="store_true", help="no terminal report (files only)")
    p.add_argument("--verbose", action="store_true",
                   help="list every check in the terminal report (default: one diagnosis per exercise)")
    p.add_argument("--hide", action="append", default=[], metavar="PATH",
                   help="check that student code cannot see PATH either (repeatable; inside the sandbox "
                        "nothing but Python and its libraries exists)")
    p.add_argument("--unconfined", action="store_true",
                   help="where the sandbox (bubblewrap) cannot be made, run your own code without it, to "
                        "check your own work; refused as root while GRADER_SEED is set; the report says so")
    return p


def _seed(args) -> int:
    """--seed, else $GRADER_SEED, else the fixed default (students' local runs)."""
    from ...engine import DEFAULT_SEED

    return seed_mod.resolve(args.seed, fallback=(DEFAULT_SEED, "the default"))[0]


def main(argv: Sequence[str] | None = None, *, registry: Mapping[str, Any] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    parser._argv = argv
    args = parser.parse_args(argv)

    from ... import engine, report
    from . import scope

    try:
        seed = _seed(args)
        timeout = engine.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive; got {timeout:g}")
    except ValueError as e:
        return _usage(args, parser, str(e))

    problem = scope.usage_problem(args.submission)
    if problem:
        return _usage(args, parser, problem, show_usage=False)
    scoped = _Scoped(args)

    reports = [os.path.abspath(p) for p in (args.json, args.junit, args.markdown, args.timing) if p]
    progress, stop = _progress_bar(args.quiet)
    try:
        chosen = args.exercise or (None if args.all_exercises else scoped)
        result = engine.grade(args.submission, seed=seed, exercises=chosen,
                              public_only=args.public_only, timeout=timeout, memory_mb=args.memory,
                              registry=registry, progress=progress, hide=[*args.hide, *reports],
                              unconfined=args.unconfined)
    except ValueError as e:  # unknown exercise names
        stop()
        return _usage(args, parser, str(e))
    except Exception as e:  # noqa: BLE001 -- the grader's own bug: still a results file, and no usage error
        stop()
        message = f"internal grader error ({type(e).__name__}: {str(e)[:200]}); please report it"
        if args.json:
            from ...report import failure_json

            try:
                failure_json(f"Not graded: {message}", args.json)
            except OSError:
                pass
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return INTERNAL_ERROR
    stop()

    umask = os.umask(0o077)  # the report files are ours alone: they hold the seed
    try:
        with result.timing.measure("reports written"):
            for path, write in ((args.json, report.write_json), (args.junit, report.write_junit),
                                (args.markdown, report.write_markdown)):
                if path:
                    write(result, path)
        if args.timing:
            report.write_timing(result, args.timing)
    finally:
        os.umask(umask)
    if not args.quiet:
        report.print_terminal(result, verbose=args.verbose, scope=scoped.scope.label,
                              course_max=scoped.course_max)
    if result.usage_error or result.internal_error:
        if args.quiet:  # else the report above said it already
            print(f"python -m grader: error: {result.error}", file=sys.stderr)
        return USAGE_ERROR if result.usage_error else INTERNAL_ERROR
    return 0


class _Scoped:
    """What a single notebook or .py file is graded on (a chapter, not all), and the course's points.

    Called by :func:`grader.engine.grade` with the registry once it has started the worker, so
    that grading one file overlaps the worker's start-up with ours as grading a folder does."""

    def __init__(self, args) -> None:
        from . import scope

        self.path = args.submission if os.path.isfile(args.submission) else None
        self.scope, self.course_max = scope.Scope(None), None

    def __call__(self, course: Mapping[str, Any]) -> list[str] | None:
        from . import scope

        if self.path is None:
            return None
        self.scope = scope.scope_of(self.path, course)
        self.course_max = sum(float(ex.points) for ex in course.values())
        return self.scope.names


def _usage(args, parser: argparse.ArgumentParser, message: str, *, show_usage: bool = True) -> int:
    """Exit status 2 after one line on stderr (with the usage line before it when ``show_usage``)."""
    if args.json:
        _usage_json(args.json, message)
    if show_usage:
        parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _progress_bar(quiet: bool):
    """A progress callback for grade() and a function to stop the bar."""
    if quiet:
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ...terminal import live_terminal

    if not live_terminal(sys.stderr):  # a pipe, a file, a notebook's ! cell: no frames to flood it
        return None, lambda: None
    console = Console(stderr=True)
    bar = Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   console=console, transient=True)
    task = bar.add_task("", total=None)
    bar.start()
    done = []

    def progress(result, total: int) -> None:
        done.append(result)
        bar.update(task, total=total, completed=len(done), description=f"{result.name}: {result.status}")

    return progress, bar.stop
