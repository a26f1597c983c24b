"""Benchmark class mode: parallel speed-up, and the cost of one submission.

Builds N submissions (copies of solutions/, every fourth one with two planted
bugs), grades the class with ``python -m grader class`` at --jobs 1 and at
--jobs J (each from scratch, --regrade), and prints:

* wall time per run and the speed-up jobs=J over jobs=1 (goal on 2 cores: >= 1.7x);
* per-submission wall time (the jobs=1 run divided by N), as a ratio to
  ``python -c "import torch"`` measured in the same run;
* the machine's load average before and after, since the machine may be shared.

Usage: python scripts/bench_classroom.py [--n 16] [--jobs 2] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
# Planted bugs: (notebook, exact solution text, buggy replacement, what it breaks).
BUGS = [
    ("ex01_leakage.ipynb", "return pos[None, :] <= pos[:, None]", "return pos[None, :] < pos[:, None]",
     "causal_mask excludes the diagonal"),
    ("ex03_padding.ipynb", "positions[None, :] < lengths[:, None]", "positions[None, :] <= lengths[:, None]",
     "padding_mask is off by one"),
]


def plant_bugs(folder: Path) -> None:
    for name, good, bad, what in BUGS:
        path = folder / name
        nb = nbformat.read(path, as_version=4)
        hits = [c for c in nb.cells if c.cell_type == "code" and good in c.source]
        if not hits:
            raise SystemExit(f"expected {good!r} in {REPO / 'solutions' / name} to plant the bug '{what}'; "
                             f"the solution changed: update BUGS in {Path(__file__).name}.")
        hits[0].source = hits[0].source.replace(good, bad)
        nbformat.write(nb, path)


def build_class(root: Path, n: int) -> Path:
    subs = root / "submissions"
    for i in range(n):
        dest = subs / f"student{i:02d}"
        shutil.copytree(REPO / "solutions", dest, ignore=shutil.ignore_patterns("*.md", ".ipynb_checkpoints"))
        if i % 4 == 3:
            plant_bugs(dest)
    return subs


def time_import_torch(repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _tree_rss(root: int) -> int:
    """Resident memory (bytes) of a process and all its descendants, from /proc."""
    parent, rss = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d.name)], rss[int(d.name)] = int(fields[1]), int(fields[21])
    total = 0
    for pid in rss:
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += rss[pid]
    return total * os.sysconf("SC_PAGE_SIZE")


def peak_memory_one(submission: Path, seed: int) -> float:
    """Peak memory (MiB) of grading one submission, summed over the grader's processes
    (the judge and its sandboxed worker): what a Gradescope container must hold."""
    proc = subprocess.Popen([sys.executable, "-m", "grader", str(submission), "--seed", str(seed), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.05)
    return peak / 2**20


def grade(subs: Path, out: Path, jobs: int, seed: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grader", "class", str(subs), "--out", str(out), "--jobs",
                           str(jobs), "--seed", str(seed), "--regrade", "--no-progress"],
                          capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"class mode failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16, help="submissions (default 16)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel workers (default: cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=Path, help="build the class here and keep it (default: a temp folder)")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-classroom-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        load0 = os.getloadavg()
        subs = build_class(root, args.n)
        t_torch = time_import_torch()  # also warms the file cache before the timed runs
        walls = {}
        for jobs in (1, args.jobs):
            walls[jobs] = grade(subs, root / f"out-jobs{jobs}", jobs, args.seed)
        load1 = os.getloadavg()
        peak_mib = peak_memory_one(subs / "student00", args.seed) if sys.platform == "linux" else float("nan")
        with open(root / f"out-jobs{args.jobs}" / "grades.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        statuses = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
        full = sum(r["total"] == r["max"] for r in rows)

        per_sub = walls[1] / args.n
        print(f"machine: {os.cpu_count()} cores; load average before {load0[0]:.2f}, after {load1[0]:.2f} "
              f"(1 min)")
        buggy = args.n // 4
        print(f"class: {args.n} submissions ({args.n - buggy} correct, {buggy} with planted bugs); "
              f"statuses {statuses}; {full} at full marks")
        print(f"python -c 'import torch': {t_torch:.2f} s (median of 5)")
        for jobs, wall in walls.items():
            print(f"jobs={jobs}: {wall:.1f} s wall for {args.n} submissions ({wall / args.n:.2f} s each)")
        speedup = walls[1] / walls[args.jobs]
        print(f"speed-up jobs={args.jobs} over jobs=1: {speedup:.2f}x (goal >= 1.7x on 2 cores)")
        print(f"per-submission wall time (jobs=1): {per_sub:.2f} s = {per_sub / t_torch:.2f}x import torch")
        print(f"peak memory grading one submission (all its processes): {peak_mib:.0f} MiB")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
