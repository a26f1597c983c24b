"""The parent's side of a grading: drive workers (:class:`grader.sandbox.popen.Worker`)
through the status protocol, with deadlines, and replace them when they die.

The parent waits on each worker's status pipe with deadlines: the load phase gets
``load_timeout``, each exercise ``timeout`` plus a grace period (the worker stops a
slow exercise itself; the grace is for code that ignores that).

:func:`run` drives as many workers as needed: when one dies or is killed in the
middle of an exercise, that exercise is charged and a fresh worker grades the
rest. What a worker left behind is read by :mod:`grader.sandbox.readback`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..timing import Timing, now
from . import allowlist, namespaces, status
from .forkserver import Server
from .limits import Limits
from .popen import Worker
from .readback import output_tail, receive, receive_record  # noqa: F401 -- read from here by the engine and tests

STARTUP_TIMEOUT = 120.0  # importing torch on a loaded machine; a grader problem if exceeded


class Handler(Protocol):
    """What :func:`run` reports, as it happens."""

    def loaded(self, data: Any) -> None: ...  # dict from the worker, or a ChannelError
    def check(self, ei: int, ci: int, outcomes: Any) -> None: ...  # list[Outcome] or ChannelError
    def exercise_done(self, ei: int) -> None: ...
    def exercise_failed(self, ei: int, reason: str) -> None: ...
    def load_failed(self, reason: str) -> None: ...
    def grader_failed(self, reason: str) -> None: ...


def run(make_job: Callable[[list[int]], Any], pending: list[int], found_of: Callable[[], set[int] | None],
        limits: Limits, handler: Handler, tmp: Path, server: Server | str, confined: bool,
        cell_label: Callable[[int], str] = str, clock: Timing | None = None) -> dict[str, str]:
    """Grade exercises ``pending`` (indices, in order), forking workers from ``server`` as needed.

    ``make_job(indices)`` builds the job for a worker, in three parts: the job itself (the cells,
    the exercises' names), the public checks' calls and the hidden checks' calls (each
    ``{index: [CheckJob]}``), sent in that order, each only when the one before has been
    answered: the calls once the submission has loaded, the hidden ones once every public check
    was judged. ``found_of()`` gives the indices the first load found (None if loading failed).
    Returns what the first worker measured of its sandbox (empty if none started). ``clock``
    counts the phases (:data:`grader.timing.PHASES`) of the sandbox and the channel.
    """
    clock = Timing() if clock is None else clock
    left = list(pending)
    n = 0
    measured: dict[str, str] = {}
    # What the worker's cgroup bounds (where it has one): the RSS watch's bound, and its tmpfs.
    memory = None if limits.memory_mb is None else (limits.memory_mb + 1024 + 256) * 2**20
    while left:
        worker = Worker(tmp, server, confined)
        n += 1
        try:
            why = worker.start(memory, clock)
            if why is not None:
                handler.grader_failed(why)
                return measured
            job, public, hidden = make_job(left)
            worker.sites = {c.filename.strip("<>") for c in getattr(job, "cells", ())}
            worker.secrets = list(getattr(job, "secrets", ()))
            worker.send(job)
            state = _Drive(worker, limits, handler, cell_label, left, first=(n == 1))
            state.parts, state.found_of, state.clock = [public, hidden], found_of, clock
            state.drive()
        finally:
            with clock.measure("worker stopped"):
                worker.stop()
        measured = measured or worker.measured
        found = found_of()
        if state.fatal or found is None:
            return measured
        left = [i for i in left if i not in state.finished and i in found]
        if state.bye:
            # The worker said it finished: anything not reported is lost for good.
            for i in left:
                handler.exercise_failed(i, "the worker finished without reporting it")
            return measured
    return measured


class _Drive:
    """Follow one worker's status lines until it says bye, dies or runs out of time."""

    def __init__(self, worker: Worker, limits: Limits, handler: Handler, cell_label, pending: list[int],
                 *, first: bool):
        self.w, self.limits, self.h = worker, limits, handler
        self.cell_label, self.pending, self.first = cell_label, pending, first
        self.phase = "startup"  # startup -> loading -> grading (public checks) -> hidden -> bye
        self.cell: int | None = None
        self.current: int | None = None  # exercise in progress
        self.finished: set[int] = set()
        self.fatal = False
        self.bye = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        # Absolute: set once per phase and per exercise, and never past the grading's own end.
        self.until = float("inf")
        self.started: set[int] = set()
        self.halved: set[int] = set()  # exercises whose public checks all ran
        self.resumed: set[int] = set()
        self.checked: set[tuple[int, int]] = set()
        self.parts: list[Any] = [{}, {}]  # the public checks' calls, then the hidden ones (run sets them)
        self.found_of: Callable[[], set[int] | None] = lambda: None
        self.clock, self.since = Timing(), now()  # (run sets the clock) since the last phase's end

    def _exercise_deadline(self) -> None:
        self.deadline = min(time.monotonic() + self.limits.timeout + self.limits.grace, self.until)

    def handle(self, line: str) -> None:
        """One status line (:mod:`grader.sandbox.status`); ChannelError if it breaks the protocol:
        unknown, out of order, or an event said twice (nothing may move a deadline twice)."""
        from . import channel  # imports torch: not needed to start a worker

        word, args = status.parse(line)
        rest = [str(a) for a in args]
        ei = args[0] if args and word not in ("ready", "refused") else None
        if word == "refused" and self.phase == "startup":
            self.fatal = True
            self.h.grader_failed(allowlist.refusal(" ".join(rest)[:200] or "its namespaces were refused"))
            self.phase = "bye"
            return
        if word == "ready" and self.phase == "startup":
            if self.w.confined:
                pairs = [r.split("=", 1) for r in rest[:8] if "=" in r and len(r) <= 40]
                self.w.measured = {k: v for k, v in pairs}
                self.w.measured["limits"] = self.w.limited[:200]
                broken = namespaces.holds(self.w.measured, getattr(self.w, "secrets", None))
                if broken is not None:
                    self.w.stop()
                    self.fatal = True
                    self.h.grader_failed(f"the sandbox did not hold ({broken}); no student code was run. "
                                         f"Fix: {allowlist.LAYOUT_HINT}")
                    self.phase = "bye"
                    return
            self.phase = "loading"
            self.deadline = time.monotonic() + self.limits.load_timeout
            self.since = self.clock.lap("sandbox ready", self.since)
        elif word == "cell" and self.phase == "loading":
            self.cell = ei
        elif word == "loaded" and self.phase == "loading":
            self.phase = "grading"
            self.since = self.clock.lap("cells loaded", self.since)
            per_exercise = self.limits.timeout + self.limits.grace
            self.until = time.monotonic() + (len(self.pending) + 1) * per_exercise
            self._exercise_deadline()
            if self.first:
                try:
                    with self.clock.measure("records read"):
                        loaded = channel.loaded_from_data(receive_record(self.w.results, args[0]))
                except channel.ChannelError as e:
                    loaded = e
                self.h.loaded(loaded)
            self.w.send(self.parts[0])  # what the load said is read: now the public calls
        elif word == "start" and self.phase == "grading" and self.current is None and ei in self.pending \
                and ei not in self.started:
            self.current = ei
            self.started.add(ei)
            self._exercise_deadline()
        elif word == "check" and ei == self.current is not None and (ei, args[1]) not in self.checked \
                and ((ei, args[1]) in self._public()) == (self.phase == "grading"):
            self.checked.add((ei, args[1]))
            try:
                with self.clock.measure("records read"):
                    data = receive_record(self.w.results, args[2])
                    if type(data) is not list:
                        raise channel.ChannelError("a check's record is not a list")
                    outcomes: Any = [channel.outcome_from_data(d) for d in data]
            except channel.ChannelError as e:
                outcomes = e
            self.h.check(ei, args[1], outcomes)
        elif word == "half" and self.phase == "grading" and ei == self.current is not None \
                and ei not in self.halved:
            self.halved.add(ei)
            self.current = None
            self._exercise_deadline()
        elif word == "public" and self.phase == "grading" and self.current is None and not self.resumed \
                and self._public_judged():
            self.phase = "hidden"
            self.w.send(self.parts[1], last=True)  # every public check is judged: now the hidden calls
        elif word == "resume" and self.phase == "hidden" and self.current is None and ei in self.halved \
                and ei not in self.resumed:
            self.current = ei
            self.resumed.add(ei)
            self._exercise_deadline()
        elif word == "done" and ei == self.current is not None and ei in self.resumed:
            self.finished.add(ei)
            self.current = None
            self.h.exercise_done(ei)
            self._exercise_deadline()
        elif word == "bye" and self.phase in ("grading", "hidden") and self.current is None:
            self.phase = "bye"
            self.bye = True
        else:
            raise channel.ChannelError(f"a status line out of order ({word})")

    def _public(self) -> set[tuple[int, int]]:
        """(exercise, check) of the public checks sent: answered before the hidden calls, never after."""
        return {(ei, c.index) for ei, checks in self.parts[0].items() for c in checks}

    def _public_judged(self) -> bool:
        """Whether every exercise this worker grades has run its public checks (said "half"): only
        then may the hidden calls go to it. Its own word is not enough (student code can write
        "public" on the status pipe): the parent counts."""
        found = self.found_of() or set()
        return all(i in self.halved for i in self.pending if i in found)

    def drive(self) -> None:
        limits = self.limits
        memory = None if limits.memory_mb is None else limits.memory_mb * 2**20 + 1024 * 2**20
        while self.phase != "bye":
            try:
                for line in self.w.lines(min(0.05, max(self.deadline - time.monotonic(), 0))):
                    if line.strip():
                        self.handle(line)
                    if self.phase == "bye":
                        return
                alive = self.w.alive()
                if not alive:
                    # Drain what it said before dying, then charge whatever it was doing.
                    for line in self.w.lines(0):
                        if line.strip():
                            self.handle(line)
            except Exception:  # noqa: BLE001 -- any byte of the worker's side is the submission's, not a crash
                self.w.stop()
                self.fail(status.UNREADABLE)
                return
            if self.phase == "bye":
                return
            if not alive:
                self.fail(self.w.how_it_ended())
                return
            if memory and self.w.rss_bytes() > memory:
                self.w.stop()
                self.fail(f"used more than {limits.memory_mb} MiB of memory and was stopped")
                return
            if time.monotonic() > self.deadline:
                self.w.stop()
                if self.phase == "loading":
                    self.fail(f"did not finish within {limits.load_timeout:g} s and was stopped")
                else:
                    self.fail(f"did not finish within {limits.timeout:g} s and was stopped "
                              "(an infinite loop, or waiting for input?)")
                return

    def fail(self, how: str) -> None:
        if self.phase == "startup":
            self.fatal = True
            self.h.grader_failed(f"the grading worker could not start: it {how}")
        elif self.phase == "loading":
            self.fatal = True
            where = "" if self.cell is None else f" while running {self.cell_label(self.cell)}"
            self.h.load_failed(f"your code {how}{where}")
        else:
            # Between two exercises (a stray thread?): charge the next one, so every restart makes progress.
            current = self.current
            if current is None:
                current = next((i for i in self.pending if i not in self.finished), None)
            if current is not None:
                self.finished.add(current)
                self.h.exercise_failed(current, f"your code {how}")
