"""Where a class's grading time goes, per student: ``python -m grader class --timing DIR``.

Each student's grading writes ``DIR/STUDENT.json`` (the engine's ``--timing``: wall and CPU seconds
per exercise and per phase of :data:`grader.timing.PHASES`); :func:`summarize` then writes
``DIR/summary.md``: for every phase outside the checks (the per-student overhead: the worker
forked, its cgroup, its sandbox, the channel, the reports) and for every exercise, the median
over the class and the highest, sorted by cost. DIR is the instructor's: nothing in it reaches a
student's feedback, and the files are parsed defensively (a grading that died leaves none, or half
of one).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...timing import PHASES

#: The largest timing file read (a grading's own is a few kB).
MAX_BYTES = 1 << 20


def student_file(folder: Path, slug: str) -> Path:
    return folder / f"{slug}.json"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _seconds(entry: Any, key: str) -> float | None:
    value = entry.get(key) if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _collect(records: Iterable[dict[str, Any]]) -> tuple[dict[str, list[tuple[float, float]]], ...]:
    """(phase -> [(wall, cpu)], exercise -> [(wall, cpu)]) over the students' records."""
    phases: dict[str, list[tuple[float, float]]] = {}
    exercises: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        parts = ((phases, record.get("phases"), None), (exercises, record.get("exercises"), "total"))
        for into, part, inner in parts:
            for name, entry in (part.items() if isinstance(part, dict) else ()):
                entry = entry.get(inner) if inner and isinstance(entry, dict) else entry
                wall, cpu = _seconds(entry, "wall"), _seconds(entry, "cpu")
                known = name in PHASES if inner is None else isinstance(name, str) and name.isidentifier()
                if known and wall is not None and cpu is not None:
                    into.setdefault(name, []).append((wall, cpu))
    return phases, exercises


def _table(title: str, rows: dict[str, list[tuple[float, float]]], order: list[str]) -> list[str]:
    lines = [f"## {title}", "", "| | students | wall median (s) | CPU median (s) | CPU highest (s) |",
             "|---|---:|---:|---:|---:|"]
    for name in order:
        spent = rows[name]
        lines.append(f"| {name} | {len(spent)} | {statistics.median(w for w, _ in spent):.3f} | "
                     f"{statistics.median(c for _, c in spent):.3f} | {max(c for _, c in spent):.3f} |")
    return [*lines, ""]


def summarize(folder: Path, slugs: Iterable[str]) -> Path:
    """Write ``folder/summary.md`` from the students' timing files; returns its path."""
    records = [r for r in (_read(student_file(folder, s)) for s in slugs) if r is not None]
    phases, exercises = _collect(records)
    cpu = lambda name, rows: statistics.median(c for _, c in rows[name])  # noqa: E731
    lines = ["# Where the class's grading time went", "",
             f"{len(records)} students' timings (a grading that died writes none). The phases are each "
             "grading's overhead outside the checks, by the grading process's clocks; the exercises' "
             "figures are their checks built, run in the worker and judged.", ""]
    lines += _table("Per-student overhead, by phase", phases, [p for p in PHASES if p in phases])
    lines += _table("Exercises, by CPU", exercises, sorted(exercises, key=lambda n: -cpu(n, exercises)))
    path = folder / "summary.md"
    path.write_text("\n".join(lines))
    return path
