"""Class mode: grade a whole class in parallel.

``python -m grader class SUBMISSIONS_DIR`` treats every sub-folder (or single
``.ipynb`` / ``.py`` file) of SUBMISSIONS_DIR as one student and grades them in
a pool of workers. Each student is graded by the engine's CLI (the arguments of
``python -m grader SUB --json RESULTS``, the seed in ``$GRADER_SEED``), forked from a server process
that has imported torch and the grader once (:class:`Preloaded`); the sandboxed
worker that runs the student's code is forked in turn from a zygote that has
imported torch and nothing of the grader's side (:mod:`grader.sandbox.zygote`). With
``--no-preload`` both are fresh interpreters. Every grading has its own session, so a
submission that hangs, crashes or floods memory costs only its own row: the
wall-time limit is enforced here by killing the grading's whole process tree.

Outputs in ``--out`` (default ``SUBMISSIONS_DIR/../grader-results``):
``STUDENT/results.json`` (Gradescope format, one per student, also for failures),
``STUDENT/grader.log`` (the grader's own output), ``grades.csv`` and
``manifest.json``, which lets a rerun skip students whose files, seed, options
and grader code have not changed.

This module holds class mode itself (its CLI, the manifest, grades.csv and the
summary). The parts live beside it: :mod:`~grader.runners.classmode.roster` (who the
students are), :mod:`~grader.runners.classmode.processes` (running one grading under a time
limit, the gradings' fork server) and :mod:`~grader.runners.classmode.scores` (reading and
scoring results.json); :mod:`~grader.sandbox.zygote` is the workers' zygote.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from ... import safetext
from ... import seed as seed_mod
from ...sandbox import allowlist
from ...sandbox.zygote import Zygote
from ...seed import SEED_ENV
from ...terminal import live_terminal, printable
from . import classtiming
from .classrun import finish, plan_from, write_grades
from .classsummary import print_summary
from .manifest import Manifest, Row
from .processes import (
    _PACKAGE_ROOT,
    Preloaded,
    kill_running,
    log_tail,
    run_limited,
    single_thread_env,
)
from .roster import Student, content_hash, discover, grading_target, no_class
from .scores import (
    contract_exercises,
    failure_results,
    isolation,
    max_score,
    per_exercise,
    read_results,
    summarize,
    total_score,
)

DEFAULT_TIMEOUT = 300.0

# A grader command: (submission path, results.json path, seed, extra CLI args) -> argv.
GraderCommand = Callable[[Path, Path, int, Sequence[str]], list[str]]


def engine_args(submission: Path, results: Path, extra: Sequence[str]) -> list[str]:
    """Arguments of the engine's CLI, the one stable seam between class mode and the engine.
    The seed is not among them: it goes by ``$GRADER_SEED`` (see :func:`grade_student`),
    since every process, the student's sandbox included, can read another's command line."""
    return [str(submission), "--json", str(results), *extra]


def engine_command(submission: Path, results: Path, seed: int, extra: Sequence[str]) -> list[str]:
    """``python -m grader ARGS``: the engine's CLI in a fresh interpreter."""
    return [sys.executable, "-m", "grader", *engine_args(submission, results, extra)]


def grader_fingerprint() -> str:
    """Hash of the grader's and the reference package's sources: a new grader regrades."""
    h = hashlib.sha256()
    import importlib.util

    roots = [Path(__file__).parents[2]]  # grader/
    spec = importlib.util.find_spec("attnmask")  # finds the package without importing torch
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent)
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- class mode


def grade_student(student: Student, out: Path, *, seed: int, timeout: float, extra: Sequence[str],
                  command: GraderCommand, exercises: Sequence[str], cores: queue.Queue | None = None,
                  preloaded: Preloaded | None = None, timing: Path | None = None) -> Row:
    """Grade one student in a killable process group; always leaves a results.json.
    ``cores``: free core ids; the grading takes one for itself while it runs.
    ``preloaded``: run the engine's CLI forked from it instead of in a fresh interpreter.
    ``timing``: a folder for the grading's ``--timing`` file (:mod:`.classtiming`)."""
    folder = out / student.slug
    folder.mkdir(parents=True, exist_ok=True)
    results_path, log = folder / "results.json", folder / "grader.log"
    results_path.unlink(missing_ok=True)  # a stale file must never pass for this run's result
    target = grading_target(student.path)
    if target is None:
        message = f"no .ipynb or .py file in the submission {student.path.name!r}: nothing to grade"
        results_path.write_text(json.dumps(failure_results(message), indent=2))
        log.write_text(message + "\n")
        return Row(student.name, student.slug, "empty", message)
    # The grader writes to a name nobody can guess; results.json is written from it here,
    # so a file the student's code planted cannot pass for a grade if the grader dies.
    private = out / ".private" / f"{student.slug}-{secrets.token_hex(16)}.json"
    private.parent.mkdir(exist_ok=True)
    env = single_thread_env()
    env[SEED_ENV] = str(seed)  # never on a command line (engine_args)
    # The grader class mode itself runs, whatever the working directory holds.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    if timing is not None and command is engine_command:  # not in the manifest's key: it grades alike
        extra = [*extra, "--timing", str(classtiming.student_file(timing, student.slug).resolve())]
    core = cores.get() if cores is not None else None
    try:
        cpus = None if core is None else {core}
        # cwd: the student's own output folder, so stray files land there. absolute(), not resolve():
        # a submission that is a link is handed over as one (the engine reads no link).
        if preloaded is not None and command is engine_command:
            args = engine_args(target.absolute(), private.resolve(), extra)
            res = preloaded.run(args, timeout=timeout, log=log, cwd=folder, cpus=cpus,
                                env={SEED_ENV: str(seed)})
        else:
            res = run_limited(command(target.absolute(), private.resolve(), seed, extra), timeout=timeout,
                              log=log, env=env, cwd=folder, cpus=cpus)
    finally:
        if core is not None:
            cores.put(core)
    results = None if res.timed_out else read_results(private)
    private.unlink(missing_ok=True)
    if res.timed_out:
        status = "timeout"
        message = (f"grading took longer than {timeout:g} s and was stopped (whole process group killed); "
                   f"last output: {log_tail(log) or '(none)'}")
    elif results is None:
        status = "crashed"
        message = (f"the grader exited with code {res.returncode} without writing results.json; "
                   f"last output: {log_tail(log) or '(none)'} (see {log})")
    if results is None:
        results_path.write_text(json.dumps(failure_results(message), indent=2))
        return Row(student.name, student.slug, status, message, seconds=res.seconds)
    results_path.write_text(json.dumps(results, indent=2))
    # A results file with no test entries means the grader refused to grade (e.g. a bad
    # option), and a non-zero exit that it could not grade (no sandbox, or one that did not
    # hold): say so instead of passing it off as a zero.
    if results.get("tests") and res.returncode == 0:
        return Row(student.name, student.slug, "graded", summarize(results, exercises),
                   total=total_score(results), max=max_score(results),
                   scores=per_exercise(results, exercises), seconds=res.seconds, isolation=isolation(results))
    why = str((results.get("extra_data") or {}).get("error") or "") or summarize(results, exercises)
    return Row(student.name, student.slug, "not graded", why, seconds=res.seconds,
               isolation=isolation(results))


def write_csv(rows: list[Row], path: Path, exercises: Sequence[str]) -> None:
    """grades.csv: student, one column per contract exercise, total, max, status, isolation, message
    (:func:`~grader.runners.classmode.classrun.write_grades` without a roster or a due date)."""
    write_grades([asdict(r) for r in rows], path, exercises, late=False, roster=False)


def grade_class(submissions: Path, out: Path, *, jobs: int, seed: int, timeout: float = DEFAULT_TIMEOUT,
                regrade: bool = False, extra: Sequence[str] = (), command: GraderCommand = engine_command,
                exercises: Sequence[str] | None = None, progress: bool = True,
                pin: bool = False, preload: bool = True, timing: Path | None = None,
                select: Callable[[list[Student]], list[Student]] | None = None) -> list[Row]:
    """Grade every student of ``submissions`` into ``out``; returns one row per student.
    ``select``: the students of those found that this run grades (a shard's, :mod:`.classrun`).
    ``timing``: where each grading writes its timing, summed up in ``summary.md`` (:mod:`.classtiming`).

    With ``pin`` (and no more jobs than cores) each grading runs on a core of its own, so
    ``--jobs N`` uses exactly N cores and leaves the rest of a shared machine alone. Not the
    default: one grading overlaps its sandbox's start-up with its own on a second core, and
    letting the OS schedule that freely grades a class faster (scripts/bench_classroom.py).

    With ``preload`` (and the engine's own command), gradings are forked from a server that
    has imported torch and the grader once (:class:`Preloaded`), and their sandboxed workers
    from a :class:`~grader.sandbox.zygote.Zygote`; else each is a fresh ``python -m grader``.
    """
    exercises = tuple(exercises) if exercises is not None else contract_exercises()
    umask = os.umask(0o077)  # results, logs and the manifest hold the seed: they are ours alone
    try:
        for folder in (out, timing):
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o700)  # a folder from an earlier run may be open to everyone
        return _grade_class(submissions, out, jobs=jobs, seed=seed, timeout=timeout, regrade=regrade,
                            extra=extra, command=command, exercises=exercises, progress=progress, pin=pin,
                            preload=preload, timing=timing, select=select)
    finally:
        os.umask(umask)


def _grade_class(submissions: Path, out: Path, *, jobs: int, seed: int, timeout: float, regrade: bool,
                 extra: Sequence[str], command: GraderCommand, exercises: Sequence[str], progress: bool,
                 pin: bool, preload: bool, timing: Path | None,
                 select: Callable[[list[Student]], list[Student]] | None) -> list[Row]:
    students, ignored = discover(submissions, out)
    students = select(students) if select is not None else students
    if ignored:
        names = ", ".join(safetext.name(p.name) for p in ignored[:5]) + (" …" if len(ignored) > 5 else "")
        print(f"note: ignored {len(ignored)} entries that are neither folders nor .ipynb/.py files: {names}",
              file=sys.stderr)
    manifest = Manifest(out / "manifest.json")
    fingerprint = grader_fingerprint()
    rows: dict[str, Row] = {}
    todo: list[tuple[Student, str]] = []
    for s in students:
        ident = [content_hash(s.path), seed, list(extra), fingerprint]
        key = hashlib.sha256(json.dumps(ident).encode()).hexdigest()
        row = None if regrade else manifest.unchanged(s.slug, key, out)
        if row is not None:
            row.student = s.name
            rows[s.slug] = row
        else:
            todo.append((s, key))
    manifest.data["seed"] = seed

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]grading[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console,
                  disable=not progress or not todo or not live_terminal(sys.stderr)) as bar:
        task = bar.add_task(f"{len(todo)} of {len(students)} students ({jobs} workers)", total=len(todo))
        cores = _core_pool(jobs) if pin else None
        # Gradings forked from a server with the grader imported, and their sandboxed workers
        # forked from a zygote with torch imported (never the reference or the cases).
        try:
            zyg = Zygote(triton=True) if preload and command is engine_command and todo else None
        except allowlist.Unavailable as e:  # no student code runs outside the sandbox
            raise SystemExit(f"grader: {allowlist.refusal(e)}") from None
        # The server also builds the class's cases and their references, once for every grading.
        preloaded = (Preloaded(zyg.env(), seed=seed, public_only="--public-only" in extra)
                     if zyg is not None else None)
        if zyg is not None and not zyg.wait_ready():  # both import torch meanwhile
            preloaded.close()
            zyg.close()
            raise SystemExit(f"grader: {allowlist.startup_refusal(zyg.failure())}")
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        if command is engine_command:  # other submissions and every grading's results are off limits
            extra = [*extra, "--hide", str(submissions.resolve()), "--hide", str(out.resolve())]
            if timing is not None:
                extra += ["--hide", str(timing.resolve())]
        job = dict(seed=seed, timeout=timeout, extra=extra, command=command, exercises=exercises, cores=cores,
                   preloaded=preloaded, timing=timing)
        futures = {pool.submit(grade_student, s, out, **job): (s, key) for s, key in todo}
        try:
            for fut in as_completed(futures):
                s, key = futures[fut]
                try:
                    row = fut.result()
                except Exception as e:  # noqa: BLE001 -- one broken row must not sink the class
                    message = f"class mode failed on this submission: {type(e).__name__}: {e}"
                    (out / s.slug).mkdir(parents=True, exist_ok=True)
                    (out / s.slug / "results.json").write_text(json.dumps(failure_results(message)))
                    row = Row(s.name, s.slug, "crashed", message)
                rows[s.slug] = row
                manifest.record(row, key)
                bar.update(task, advance=1, description=escape(printable(f"{s.name}: {row.status}")))
        except BaseException:
            # Ctrl-C: stop now, not after the running students finish. Finished rows are
            # in the manifest, so the same command resumes where this run stopped.
            pool.shutdown(wait=False, cancel_futures=True)
            kill_running()
            if preloaded is not None:
                preloaded.close()
                zyg.close()
            print(f"\ninterrupted after {len(rows) - (len(students) - len(todo))} of {len(todo)} students; "
                  f"run the same command again to grade the rest", file=sys.stderr)
            raise
        pool.shutdown()
        if preloaded is not None:
            preloaded.close()
            zyg.close()
    ordered = [rows[s.slug] for s in students]
    write_csv(ordered, out / "grades.csv", exercises)
    if timing is not None:
        classtiming.summarize(timing, [s.slug for s, _ in todo])
    return ordered


def _core_pool(jobs: int) -> queue.Queue | None:
    """A queue of ``jobs`` distinct core ids, or None where pinning is not possible."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    available = sorted(os.sched_getaffinity(0))
    if jobs > len(available):  # oversubscription was asked for: let the OS share the cores
        return None
    q: queue.Queue = queue.Queue()
    for c in available[:jobs]:
        q.put(c)
    return q


def last_run_seed(out: Path) -> tuple[int, str] | None:
    """The seed of the last class run into ``out`` and where it was read, if any: class
    mode's fallback after --seed and $GRADER_SEED (:func:`grader.seed.resolve`)."""
    try:
        seed = json.loads((out / "manifest.json").read_text()).get("seed")
    except (OSError, ValueError, AttributeError):
        return None
    return (seed, f"the last run's manifest in {out}") if isinstance(seed, int) else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grader class",
        description="Grade a whole class: every sub-folder (or single .ipynb/.py) of SUBMISSIONS_DIR is one "
                    "student. Writes OUT/STUDENT/results.json, OUT/grades.csv and a manifest that lets a "
                    "rerun skip unchanged submissions.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--out", type=Path, help="output folder (default: SUBMISSIONS_DIR/../grader-results)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="students graded at once (default: the number of cores, %(default)s)")
    p.add_argument("--seed", type=int,
                   help="hidden-case seed (default: $GRADER_SEED, else the last run's, else drawn at random; "
                        "printed either way)")
    p.add_argument("--regrade", action="store_true", help="grade every student, even unchanged ones")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="wall-time limit per student in seconds (default %(default)s)")
    p.add_argument("--exercise-timeout", type=float, metavar="S",
                   help="the grader's own time limit per exercise (its --timeout; default: the grader's)")
    p.add_argument("--exercise", action="append", default=[], metavar="NAME",
                   help="grade only this exercise (repeatable); passed to the grader")
    p.add_argument("--public-only", action="store_true", help="run only the public checks")
    p.add_argument("--pin", action="store_true",
                   help="give each grading one core of its own, so --jobs N uses exactly N cores "
                        "(on a shared machine); a little slower when all cores are free")
    p.add_argument("--no-preload", action="store_true",
                   help="grade each student with a fresh `python -m grader` (and a fresh sandbox) instead "
                        "of forking them from processes that have imported torch already (slower; for "
                        "comparison)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--timing", type=Path, metavar="DIR", help="write where each grading's time went to "
                   "DIR/STUDENT.json, and DIR/summary.md (the per-student overhead by phase, the exercises "
                   "by cost); the instructor's, in nothing a student sees")
    p.add_argument("--shard", metavar="i/N", help="grade only shard i of N (0 <= i < N; default: from Slurm, "
                   "Kubernetes or $GRADER_SHARD, else the whole class); merge with `python -m grader merge`")
    p.add_argument("--roster", type=Path, help="roster CSV: every student on it gets a row, 'missing' "
                   "included (ours: id,name[,folder,extension_days,due,submitted]; GitHub Classroom's and "
                   "Gradescope's as downloaded)")
    p.add_argument("--due", help="due date, ISO 8601 (e.g. 2026-12-01T23:59:00+01:00)")
    p.add_argument("--trust-student-dates", action="store_true",
                   help="count lateness from a hand-in time the student wrote (the last commit's date, file "
                        "times) where the roster has no platform time; by default such a date is shown and "
                        "not counted, since a backdated commit would make its author on time")
    p.add_argument("--late-policy", default="none", help="none, P/day or P/day,cap=C: percent of the maximum "
                   "off per started day late (default none)")
    p.add_argument("--no-report", action="store_true", help="no class-report.html / class-report.md")
    return p


def main(argv: Sequence[str] | None = None, *, command: GraderCommand = engine_command,
         exercises: Sequence[str] | None = None) -> int:
    """``python -m grader class ...``. Exit status 0 when every student got a row."""
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1; got {args.jobs}.")
    if args.timeout <= 0:
        raise SystemExit(f"--timeout must be a positive number of seconds; got {args.timeout}.")
    out = args.out if args.out is not None else args.submissions.resolve().parent / "grader-results"
    problem = no_class(args.submissions, out)
    if problem:  # before the seed is drawn and printed: nothing was graded with it
        print(f"python -m grader class: error: {problem}", file=sys.stderr)
        return 2
    seed, origin = seed_mod.for_command(args.seed, fallback=last_run_seed(out))
    print(f"seed {seed} ({origin})", file=sys.stderr)
    # Every student is graded out of the same maximum: a lone notebook is not graded out of its chapter.
    extra: list[str] = [] if args.exercise else ["--all-exercises"]
    for name in args.exercise:
        extra += ["--exercise", name]
    if args.public_only:
        extra.append("--public-only")
    if args.exercise_timeout is not None:
        extra += ["--timeout", f"{args.exercise_timeout:g}"]
    plan = plan_from(shard=args.shard, roster=args.roster, due=args.due, late_policy=args.late_policy,
                     report=not args.no_report, trust_claims=args.trust_student_dates)
    if plan.shard is not None:
        print(f"shard {plan.shard} ({plan.shard_origin})", file=sys.stderr)
    t0 = time.perf_counter()
    rows = grade_class(args.submissions, out, jobs=args.jobs, seed=seed, timeout=args.timeout,
                       regrade=args.regrade, extra=extra, command=command, exercises=exercises,
                       progress=not args.no_progress, pin=args.pin,
                       preload=not args.no_preload, timing=args.timing, select=plan.select)
    wall = time.perf_counter() - t0
    finish(out, plan, rows, fingerprint=grader_fingerprint(), seed=seed, wall=wall, extra=extra,
           exercises=tuple(exercises) if exercises is not None else contract_exercises())
    print_summary(rows, seed=seed, out=out, wall=wall, jobs=args.jobs)
    return 0
