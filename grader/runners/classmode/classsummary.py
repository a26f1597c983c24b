"""The table class mode prints when it is done: how the class did and who could not be graded."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...terminal import printable
from .scores import _fmt


def print_summary(rows: Sequence[Any], *, seed: int, out: Path, wall: float, jobs: int) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: room for the whole table
        console = Console(width=110)
    totals = [r.total for r in rows]
    maxes = [r.max for r in rows if r.max is not None]
    top = statistics.mode(maxes) if maxes else None
    failures = [r for r in rows if r.status != "graded"]
    unconfined = [r for r in rows if getattr(r, "isolation", "").startswith("NOT HELD")]
    skipped = sum(r.skipped for r in rows)

    def pts(x: float) -> str:
        return f"{x:.1f}" + (f"/{_fmt(top)}" if top else "")

    t = Table(title="Class grading summary")
    for col in ("students", "graded", "unchanged", "mean", "median", "full marks", "zero", "failures"):
        t.add_column(col, justify="right")
    full = sum(1 for r in rows if r.max and r.total >= r.max)
    zero = sum(1 for r in rows if r.total == 0)
    graded_now = sum(1 for r in rows if r.status == "graded" and not r.skipped)  # "empty" is no grading
    t.add_row(str(len(rows)), str(graded_now), str(skipped),
              pts(statistics.fmean(totals)) if totals else "-",
              pts(statistics.median(totals)) if totals else "-",
              str(full), str(zero), str(len(failures)))
    console.print(t)
    if failures:
        f = Table(title="Submissions that could not be graded")
        for col in ("student", "status", "why"):
            f.add_column(col, overflow="fold")
        for r in failures:  # as text: a folder's name may hold markup or escapes
            f.add_row(*(Text(printable(x)) for x in (r.student, r.status, r.message)))
        console.print(f)
    graded = [r for r in rows if r.status == "graded"]
    if unconfined:
        console.print(f"[bold red]isolation did not hold for {len(unconfined)} of {len(graded)} graded "
                      f"students[/bold red] (grades.csv, column isolation): {unconfined[0].isolation}")
    else:
        console.print(f"isolation held for every graded student ({len(graded)}): bubblewrap, as each worker "
                      "measured it")
    console.print(f"seed {seed} (reproduce with GRADER_SEED={seed}) · {jobs} workers · {wall:.1f} s wall · "
                  f"grades: {out / 'grades.csv'}")


