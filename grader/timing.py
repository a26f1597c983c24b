"""Where a grading's time goes: wall and CPU seconds per exercise and phase, for the instructor.

Each exercise's :class:`ExerciseTiming` adds up what its grading cost:

* ``build``: its checks built in the grading process (cases drawn, references computed);
* ``run``: its calls made in the worker, by the worker's own clocks (each
  :attr:`~grader.spec.Outcome.seconds` and :attr:`~grader.spec.Outcome.cpu`: the student's
  function, the arguments' copies and the outputs' conversion);
* ``judge``: its outcomes judged in the grading process (references the judges compute, the
  comparisons, the diagnoses).

``run`` and ``judge`` are kept apart for the public and the hidden checks; a public check's
own figures are kept too (``public_checks``), a hidden check's never: its time could tell how
big its hidden case is.

A grading's :class:`Timing` holds those, and what the grading cost outside any exercise's
checks, by phase (:data:`PHASES`), by the grading process's own clocks: a phase spent waiting
on the worker costs it wall time and little CPU. In class mode, where every grading is forked
from a process that imported everything once, these phases are the per-student overhead.

None of this is in what a student sees (the terminal, results.json, JUnit, Markdown, class
mode's feedback.md): the CLI writes it only where ``--timing PATH`` says, and
``scripts/bench_grader.py --by-exercise`` tabulates it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Spent:
    """Seconds spent: ``wall`` (the clock on the wall) and ``cpu`` (the process's CPU, all its threads)."""

    wall: float = 0.0
    cpu: float = 0.0

    def add(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu

    def to_dict(self) -> dict[str, float]:
        return {"wall": round(self.wall, 4), "cpu": round(self.cpu, 4)}


@contextlib.contextmanager
def measure(into: Spent) -> Iterator[None]:
    """Add the wall and CPU seconds of the ``with`` block to ``into``."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        into.add(time.perf_counter() - wall, time.process_time() - cpu)


def _parts() -> dict[str, Spent]:
    return {"public": Spent(), "hidden": Spent()}


@dataclass
class ExerciseTiming:
    """One exercise's costs (see the module's docstring); ``run`` and ``judge`` by ``"public"``
    and ``"hidden"``."""

    build: Spent = field(default_factory=Spent)
    run: dict[str, Spent] = field(default_factory=_parts)
    judge: dict[str, Spent] = field(default_factory=_parts)
    public_checks: dict[str, dict[str, Spent]] = field(default_factory=dict)

    def count(self, name: str, public: bool, outcomes: Any, judged: Spent) -> None:
        """Count one check: the worker's time in its ``outcomes`` (a list of
        :class:`~grader.spec.Outcome`, or whatever the channel gave instead), and ``judged``."""
        part = "public" if public else "hidden"
        ran = Spent()
        for o in outcomes if isinstance(outcomes, list) else ():
            ran.add(o.seconds, o.cpu)
        self.run[part].add(ran.wall, ran.cpu)
        self.judge[part].add(judged.wall, judged.cpu)
        if public:
            own = self.public_checks.setdefault(name, {"run": Spent(), "judge": Spent()})
            own["run"].add(ran.wall, ran.cpu)
            own["judge"].add(judged.wall, judged.cpu)

    @property
    def total(self) -> Spent:
        parts = [self.build, *self.run.values(), *self.judge.values()]
        return Spent(sum(p.wall for p in parts), sum(p.cpu for p in parts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.to_dict(), "build": self.build.to_dict(),
            "run": {k: v.to_dict() for k, v in self.run.items()},
            "judge": {k: v.to_dict() for k, v in self.judge.items()},
            "public_checks": {name: {k: v.to_dict() for k, v in own.items()}
                              for name, own in self.public_checks.items()},
        }


#: A grading's phases outside its exercises' checks, in the order they come.
PHASES = {
    "started": "the process's start up to the grading: the interpreter, the imports (in class mode, "
               "a fork of a process that made them)",
    "checks loaded": "the checks' modules imported, with torch and the reference (in class mode, imported "
                     "already)",
    "zygote awaited": "waiting for the workers' zygote (a grading of its own starts one, which imports "
                      "torch meanwhile)",
    "worker forked": "a worker forked from the zygote and handed its descriptors",
    "cgroup": "the worker's cgroup made, and the worker moved into it",
    "sandbox ready": "until the worker says ready: its namespaces entered, its seccomp filter loaded, "
                     "the job read, its isolation measured",
    "cells loaded": "until the submission's cells have run in the worker",
    "records read": "the worker's records read and checked (the channel)",
    "worker stopped": "the worker ended, its cgroup removed",
    "reports written": "results.json and the other reports written",
}


@dataclass
class Timing:
    """A grading's costs: each exercise's (:class:`ExerciseTiming`, by name) and, outside any
    exercise's checks, each phase's (:data:`PHASES`)."""

    exercises: dict[str, ExerciseTiming] = field(default_factory=dict)
    phases: dict[str, Spent] = field(default_factory=dict)

    def measure(self, phase: str) -> contextlib.AbstractContextManager[None]:
        """Add the ``with`` block's seconds to ``phase``."""
        return measure(self.phases.setdefault(phase, Spent()))

    def lap(self, phase: str, since: tuple[float, float]) -> tuple[float, float]:
        """Add the seconds since ``since`` (a :func:`now`) to ``phase``; returns :func:`now`."""
        at = now()
        self.phases.setdefault(phase, Spent()).add(at[0] - since[0], at[1] - since[1])
        return at

    def started(self) -> None:
        """Count the process's time so far as the phase ``started`` (Linux; elsewhere its CPU only)."""
        wall = 0.0
        try:
            with open("/proc/self/stat") as f:
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
            wall = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            pass
        self.phases.setdefault("started", Spent()).add(max(wall, 0.0), time.process_time())


def now() -> tuple[float, float]:
    """(wall, CPU) seconds now, for :meth:`Timing.lap`."""
    return time.perf_counter(), time.process_time()


def of_report(report: Any) -> dict[str, Any]:
    """A :class:`~grader.results.Report`'s timings as plain data: the grading's wall seconds,
    each exercise's chapter and :meth:`ExerciseTiming.to_dict` in the report's order, then the
    phases."""
    spent = report.timing
    return {"execution_time": round(report.execution_time, 3),
            "exercises": {e.name: {"chapter": e.chapter, **spent.exercises[e.name].to_dict()}
                          for e in report.exercises if e.name in spent.exercises},
            "phases": {name: spent.phases[name].to_dict() for name in PHASES if name in spent.phases}}
