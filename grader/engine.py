"""Grade a submission: read it, run it in a worker, judge what came back, score.

:func:`grade` is the in-process API (the CLI, class mode and Gradescope use it):

    report = grade("exercises/", seed=0)
    report.score, report.max_score, report.exercise("causal_mask").status

The parent process never imports student code. It starts a worker at once (the worker imports
torch while we import ours and build the checks), sends it the cells and the calls, and judges each
check's outcomes as they arrive with the checks' own judges, which compute the reference with
``attnmask`` (in the student template: the public checks' outputs recorded at release).

Student code runs inside bubblewrap (:mod:`grader.sandbox.allowlist`), in
namespaces of its own: it sees no file of the course, the grader's results or
other students, and nothing it leaves behind outlives its grading. Where that
sandbox cannot be made the grading stops before any student code runs, unless the
user asked to run their own code without it (``unconfined``), which root may only
where no secret seed is set (:func:`grader.sandbox.allowlist.unconfined_refused`);
the report's isolation block says which, as the worker measured it.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import hidden, rules, safetext, submission, timing
from .checks import has_reference  # light: grader.checks imports its chapters (and torch) when asked
from .devices import NEEDS_TRITON, cuda_available, needs_cuda, one_thread, triton_available
from .results import (
    CRASHED,
    GRADER_ERROR,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    NOT_IMPLEMENTED_MESSAGE,
    TIMED_OUT,
    ExerciseResult,
    Report,
)
from .sandbox import allowlist, bubblewrap, namespaces, zygote
from .sandbox.limits import TIME_LIMIT, Limits
from .verdicts import all_not_implemented, check_result, judge

DEFAULT_SEED = 0
DEFAULT_TIMEOUT = 10.0


def load_registry() -> Mapping[str, Any]:
    """The exercises, in chapter order (``grader.checks.EXERCISES``)."""
    from .checks import EXERCISES

    return EXERCISES


def select(registry: Mapping[str, Any], names: Iterable[str] | None) -> list[Any]:
    """The exercises to grade, in chapter order; ValueError naming the unknown ones."""
    if not names:
        return list(registry.values())
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown exercise {', '.join(map(repr, unknown))}; "
                         f"choose from: {', '.join(registry)}")
    return [ex for name, ex in registry.items() if name in names]


# --------------------------------------------------------------------------- grading one submission


class _Exercise:
    """Grading state of one exercise in the parent."""

    def __init__(self, index: int, exercise, seed: int, public_only: bool, has_cuda: bool,
                 checks: list | None = None):
        self.index, self.exercise = index, exercise
        self.result = ExerciseResult(exercise.name, int(exercise.chapter), float(exercise.points))
        self.checks: list = []
        self.verdicts: list = []
        self.outcomes_seen: list = []
        self.findings: list[rules.Finding] = []
        self.final = False
        self.public_errors: dict[str, str] = {}  # exception type -> the public check that raised it
        self.timed_out: int | None = None  # the check in which the worker stopped a call at the time limit
        self.timing = timing.ExerciseTiming()
        from .spec import Verdict

        try:
            with timing.measure(self.timing.build):
                self.checks = list(exercise.make_checks(seed, hidden=not public_only) if checks is None
                                   else checks)
        except Exception as e:  # noqa: BLE001
            self.result.status = GRADER_ERROR
            self.result.message = (f"internal grader error: the checks could not be built "
                                   f"({type(e).__name__}: {e}); please report it")
        self.verdicts = [None] * len(self.checks)
        for ci, check in enumerate(self.checks):
            if needs_cuda(check) and not has_cuda:
                self.verdicts[ci] = Verdict(False, "needs a CUDA GPU; this machine has none", skipped=True)
            elif check.requires == "triton" and not triton_available():
                self.verdicts[ci] = Verdict(False, NEEDS_TRITON, skipped=True)

    def public_done(self) -> bool:
        """Whether every public check has its verdict (the worker had moved on to the hidden ones)."""
        return all(v is not None for c, v in zip(self.checks, self.verdicts) if c.public)

    @property
    def runnable(self) -> list[int]:
        return [ci for ci, v in enumerate(self.verdicts) if v is None]

    def fail_rest(self, message: str, rest: str | None = None) -> None:
        """Fail the checks without a verdict: the first with ``message``, the others with ``rest``."""
        from .spec import Verdict

        for ci, v in enumerate(self.verdicts):
            if v is None:
                self.verdicts[ci] = Verdict(False, message)
                message = rest or message

    def finish(self) -> ExerciseResult:
        r = self.result
        self.fail_rest("not run")
        r.checks = [check_result(c, v) for c, v in zip(self.checks, self.verdicts)]
        if r.status not in (NOT_FOUND, GRADER_ERROR, CRASHED, TIMED_OUT):
            if all_not_implemented(self.outcomes_seen):
                r.status, r.message = NOT_IMPLEMENTED, NOT_IMPLEMENTED_MESSAGE
            elif self.timed_out is not None:
                check, verdict = self.checks[self.timed_out], self.verdicts[self.timed_out]
                r.status, r.message = TIMED_OUT, f"{check.name}: {verdict.message}"
        r.notes.extend(f.text for f in self.findings if f.text not in r.notes)
        r.finish()
        self.final = True
        return r


class _Grading:
    """The sandbox's handler: turns worker events into verdicts."""

    def __init__(self, states: list[_Exercise], src: submission.Source, limits: Limits, report: Report,
                 progress: Callable[[ExerciseResult, int], None] | None):
        self.states, self.src, self.limits, self.report = states, src, limits, report
        self.progress = progress
        self.found: set[int] | None = None
        self.loaded_ok = False  # the submission's cells ran to the end
        # Hidden cases drawn from a seed of the instructor's: nothing the submission says or does may
        # carry them out (grader.hidden). The default seed's cases are no secret: anyone with the
        # course can draw them, and a student grading their own work sees everything.
        self.secret = not report.public_only and report.seed != DEFAULT_SEED

    def _emit(self, st: _Exercise) -> None:
        if not st.final:
            if self.secret and st.result.status not in (NOT_FOUND, GRADER_ERROR, CRASHED, TIMED_OUT):
                _bound_hidden(st)  # (those four are said before any hidden case reached the worker)
            st.finish()
            if self.progress:
                self.progress(st.result, len(self.states))

    def loaded(self, data: Any) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("found"), dict):
            self.load_failed("the grader could not read which functions your submission defines "
                             "(did your code overwrite the grader's files?)")
            return
        self.loaded_ok = True
        found = {k: v for k, v in data["found"].items() if isinstance(k, str)}
        errors = [e for e in data.get("errors", []) if isinstance(e, str)]
        if self.secret:  # the grader's words only: the worker's records are the submission's to write
            places, budget = self.src.statement_places(), self.limits.cell_budget
            notes = (hidden.load_note(e, places, budget) for e in errors)
            errors = list(dict.fromkeys(n for n in notes if n))
        self.report.notes.extend(f"skipped: {e}" for e in errors)
        self.found = set()
        for st in self.states:
            if st.exercise.name in found:
                self.found.add(st.index)
                where = found[st.exercise.name]
                st.result.found_at = where if isinstance(where, str) else None
            elif st.result.status != GRADER_ERROR:
                st.result.status = NOT_FOUND
                st.result.message = not_found_message(st.exercise.name, self.src)
                st.fail_rest(NOT_FOUND)
                self._emit(st)

    def check(self, ei: int, ci: int, outcomes: Any) -> None:
        if not 0 <= ei < len(self.states):
            return
        st = self.states[ei]
        if st.final or not 0 <= ci < len(st.checks) or st.verdicts[ci] is not None:
            return
        if isinstance(outcomes, list) and (st.checks[ci].public or not self.secret):
            st.outcomes_seen.extend(o.error for o in outcomes)  # only errors: records are not kept
            if st.timed_out is None and any(o.error and o.error.startswith(TIME_LIMIT) for o in outcomes):
                st.timed_out = ci
        judged = timing.Spent()
        with timing.measure(judged):
            st.verdicts[ci] = judge(st.checks[ci], outcomes, st.findings, timeout=self.limits.timeout,
                                    public_errors=st.public_errors, hidden_run=self.secret)
        st.timing.count(st.checks[ci].name, st.checks[ci].public, outcomes, judged)

    def exercise_done(self, ei: int) -> None:
        if 0 <= ei < len(self.states):
            self._emit(self.states[ei])

    def exercise_failed(self, ei: int, reason: str) -> None:
        if not 0 <= ei < len(self.states) or self.states[ei].final:
            return
        st = self.states[ei]
        if self.secret and st.public_done():  # stopped among the hidden checks: a failure of those, no more
            st.fail_rest(hidden.FAILED)
            self._emit(st)
            return
        st.result.status = TIMED_OUT if "did not finish" in reason else CRASHED
        reason = hidden.stopped(reason) if self.secret else reason
        st.result.message = reason
        st.fail_rest(reason, "not run: the check before it stopped the grading process")
        self._emit(st)

    def load_failed(self, reason: str) -> None:
        if self.found is None:
            self.found = set()
        reason = hidden.stopped(reason) if self.secret else reason
        for st in self.states:
            if st.final:
                continue
            if st.result.status != GRADER_ERROR:
                st.result.status = TIMED_OUT if "did not finish" in reason else CRASHED
                st.result.message = f"{reason}, before any exercise could be graded"
            st.fail_rest(st.result.message)
            self._emit(st)

    def grader_failed(self, reason: str) -> None:
        self.report.error = reason
        self.report.internal_error = True  # no grade: the CLI exits non-zero, class mode says "not graded"
        for st in self.states:
            if not st.final:
                st.result.status, st.result.message = GRADER_ERROR, reason
                self._emit(st)


def _bound_hidden(st: _Exercise) -> None:
    """In a grading with the instructor's seed: each failing hidden check says :data:`hidden.FAILED`,
    with a detail drawn from the public checks alone, and a time limit met among the hidden checks
    is one of their failures, not the exercise's status (see :mod:`grader.hidden`)."""
    from .spec import Verdict

    failing = [c.name for c, v in zip(st.checks, st.verdicts)
               if c.public and v is not None and not v.passed and not v.skipped]
    detail = hidden.failed(failing)
    for ci, (check, v) in enumerate(zip(st.checks, st.verdicts)):
        if not check.public and (v is None or not (v.passed or v.skipped)):
            st.verdicts[ci] = Verdict(False, hidden.FAILED, detail)
    if st.timed_out is not None and not st.checks[st.timed_out].public:
        st.timed_out = None


def not_found_message(name: str, src: submission.Source) -> str:
    """Why ``name`` was not found, as precisely as the source allows."""
    for cell, err in src.syntax_errors:
        if name in submission.defined_names(cell):
            return f"not found: {err}, in the cell that defines {name}"
    if not src.cells:
        return "not found: " + ("; ".join(src.problems) or "the submission has no code")
    defined = set()
    for cell in src.cells:
        defined |= submission.defined_names(cell)
    close = difflib.get_close_matches(name, sorted(defined), n=1, cutoff=0.75)
    hint = f" (there is a {close[0]}: rename it?)" if close else ""
    return f"not found: the submission defines no function named {name}{hint}"


def grade(
    path: str | os.PathLike,
    *,
    seed: int = DEFAULT_SEED,
    exercises: Iterable[str] | Callable[[Mapping[str, Any]], Iterable[str] | None] | None = None,
    public_only: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    load_timeout: float | None = None,
    memory_mb: int | None = 2048,
    registry: Mapping[str, Any] | None = None,
    progress: Callable[[ExerciseResult, int], None] | None = None,
    hide: Iterable[str | os.PathLike] = (),
    unconfined: bool = False,
) -> Report:
    """Grade the submission at ``path`` and return a :class:`~grader.results.Report`.

    Args:
        path: an exercise notebook, a .py file, or a folder of them.
        seed: draws the hidden cases; the same seed gives the same report.
        exercises: names to grade (default: all), or a function of the registry giving them.
        public_only: run only the public checks (those the notebook's ``check`` runs).
        timeout: seconds per exercise; also the budget of one notebook cell.
        load_timeout: seconds to run the submission's cells (default 4 x timeout).
        memory_mb: memory the student's code may use beyond torch's own.
        registry: ``{name: Exercise}`` to grade against (default ``grader.checks.EXERCISES``).
        progress: called with each exercise's result as soon as it is final, and
            the number of exercises being graded.
        hide: more paths the worker must prove it cannot see (besides the course,
            the grader and the submission itself): other submissions, report files.
        unconfined: run student code without the sandbox, for a student checking their
            own work (refused as root while GRADER_SEED is set; the report says so).

    Never raises for anything in the submission: unreadable files, code that
    crashes, hangs or cheats all end up as messages in the report.
    """
    t0 = time.perf_counter()
    public_only = public_only or (registry is None and not has_reference())  # the template: public only
    limits = Limits(timeout=timeout, load_timeout=load_timeout or 4 * timeout, memory_mb=memory_mb)
    report = Report(submission=str(path), seed=int(seed), public_only=public_only)
    report.timing.started()
    try:
        src = submission.read(path)
    except submission.SubmissionError as e:
        src, report.error, report.usage_error = None, str(e), True
    tmp = Path(tempfile.mkdtemp(prefix="grader-"))
    grading = server = None
    confined = True
    if src is not None and src.runnable:
        # Start the zygote before our own heavy imports: it imports torch meanwhile.
        server, confined, refused = zygote.for_grading(unconfined)
        if refused is not None:
            src, report.error, report.internal_error = None, refused, True
        elif unconfined and confined:  # asked for, refused, graded in the sandbox: never in silence
            why = allowlist.unconfined_refused() or "class mode's sandbox is shared"
            report.notes.append(f"--unconfined was refused ({why}): graded inside the sandbox")
    try:
        try:
            with report.timing.measure("checks loaded"):
                registry = load_registry() if registry is None else registry
        except Exception as e:  # noqa: BLE001 -- the grader's own bug: say so, in the report
            report.error = (f"internal grader error: the checks could not be loaded ({type(e).__name__}: "
                            f"{e}); please report it to the course staff")
            report.internal_error = True
            return report
        selected = select(registry, exercises(registry) if callable(exercises) else exercises)
        has_cuda = cuda_available()
        with one_thread():
            states = [_Exercise(i, ex, seed, public_only, has_cuda) for i, ex in enumerate(selected)]
        report.exercises = [st.result for st in states]
        report.timing.exercises = {st.exercise.name: st.timing for st in states}
        if src is None:
            # The submission could not be read (not found), or no student code may run here (not graded).
            status = GRADER_ERROR if report.internal_error else NOT_FOUND
            for st in states:
                st.result.status, st.result.message = status, f"not graded: {report.error}"
                st.finish()
            return report
        _note_source_problems(src, report)
        _scan_rules(src, states)
        grading = _Grading(states, src, limits, report, progress)
        if server is None:
            grading.loaded({"found": {}, "errors": []})
        else:
            secrets = allowlist.secret_paths([path, *hide])
            with one_thread():
                measured = _run(src, states, limits, grading, tmp, server, confined, secrets, report.timing)
            report.isolation = namespaces.isolation(confined, measured, secrets)
            if confined:
                report.isolation.update(bubblewrap.describe())
        for st in states:
            grading._emit(st)
        if grading.loaded_ok and not grading.found and src.cells:
            report.notes.append("no exercise functions found: define them with the names of the exercises "
                                f"({', '.join(st.exercise.name for st in states[:3])}, ...)")
        from .sandbox.supervisor import output_tail  # what the submission printed, its paths hidden

        report.output = output_tail(tmp).replace(str(tmp), "<tmp>")
        return report
    finally:
        if isinstance(server, zygote.Zygote):
            server.close()
        shutil.rmtree(tmp, ignore_errors=True)
        # Every string of the report may hold the submission's bytes (a lone surrogate, an escape):
        # cleaned once here, for every writer after (results.json, the terminal, grades.csv).
        vars(report).update(vars(safetext.clean(report)))
        report.execution_time = time.perf_counter() - t0


def _note_source_problems(src: submission.Source, report: Report) -> None:
    report.notes.extend(src.problems)
    for cell, err in src.syntax_errors:
        defines = sorted(submission.defined_names(cell))
        what = f" (it defines {', '.join(defines)})" if defines else ""
        report.notes.append(f"skipped: {err}{what}")


def _scan_rules(src: submission.Source, states: list[_Exercise]) -> None:
    by_file: dict[str, list] = {}
    for cell, tree in src.trees():
        by_file.setdefault(cell.file, []).append((tree, cell.label, cell.line_offset))
    by_name = {st.exercise.name: st for st in states}
    for trees in by_file.values():
        for finding in rules.scan_trees(trees, by_name):
            st = by_name[finding.exercise]
            if finding not in st.findings:
                st.findings.append(finding)


def _run(src, states, limits, grading, tmp, server, confined: bool, secrets: list[str],
         clock: timing.Timing) -> dict[str, str]:
    from .sandbox import supervisor
    from .sandbox.worker import CheckJob, Job

    def make_job(indices: list[int]) -> tuple[Job, dict[int, list[CheckJob]], dict[int, list[CheckJob]]]:
        """The job (cells and names), then the public checks' calls, then the hidden ones'."""
        public: dict[int, list[CheckJob]] = {}
        hidden: dict[int, list[CheckJob]] = {}
        for i in indices:
            st = states[i]
            for ci in st.runnable:
                check = st.checks[ci]
                part = public if check.public else hidden
                part.setdefault(i, []).append(CheckJob(ci, check.calls, bool(check.want_grads)))
        job = Job(cells=src.cells, exercises=[(i, states[i].exercise.name, []) for i in indices],
                  cell_budget=limits.cell_budget, exercise_budget=limits.timeout,
                  memory_bytes=None if limits.memory_mb is None else limits.memory_mb * 2**20,
                  helpers=src.helpers, secrets=secrets)
        return job, public, hidden

    pending = [st.index for st in states if not st.final and st.result.status != GRADER_ERROR]
    return supervisor.run(make_job, pending, lambda: grading.found, limits, grading, tmp, server, confined,
                          cell_label=lambda i: src.cells[i].label if 0 <= i < len(src.cells) else f"cell {i}",
                          clock=clock)
