"""Benchmark class mode: parallel speed-up, and the cost of one submission.

Builds N submissions (copies of solutions/, every fourth one with two planted
bugs), grades the class with ``python -m grader class`` at --jobs 1 and at
--jobs J (each from scratch, --regrade; every setting in turn, --repeats rounds, so that
a burst of load on a shared machine hits all settings alike), and prints medians over
the rounds with their spread (lowest-highest), and each speed-up as the median of the
rounds' paired ratios with their range:

* wall time, CPU time and cores kept busy per setting: class mode's default
  (gradings forked from a server that imported torch once, their sandboxes from
  a zygote that did), --pin (one core per worker), and --no-preload (a fresh
  ``python -m grader`` per student);
* the parallel speed-up (goal on 2 cores: >= 1.7x) as strong scaling: the
  default at jobs=J on every core over jobs=1 with the whole run confined to one
  core; and the speed-up jobs=J over jobs=1 with both free to use every core,
  which is smaller because a single grading already runs on more than one core
  (its sandbox works while it judges);
* how many of the machine's cores jobs=J keeps busy (CPU time / wall time);
* per-submission wall time (the jobs=1 run divided by N), as a ratio to
  ``python -c "import torch"`` measured in the same run;
* peak memory of one grading (all its processes: what a Gradescope container needs);
* the machine's load average before and after, since the machine may be shared.

Usage: python scripts/bench_classroom.py [--n 16] [--jobs 2] [--repeats 5] [--seed 0] [--keep DIR]
       python scripts/bench_classroom.py --slope   (marginal cost per student, 16 -> 128 students)
       python scripts/bench_classroom.py --slope --exercise causal_mask --exercise ...   (those only)
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
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


ONE_CORE = "(1 core)"  # not a class-mode flag: the whole run confined to one core


def cpu_seconds() -> float:
    """CPU time spent so far: the whole machine's busy time (/proc/stat) where Linux gives it.

    getrusage(RUSAGE_CHILDREN) cannot see into bubblewrap: a process that bwrap runs never adds
    its CPU time to ours (a bwrap'd `python -c` busy for 0.5 s adds 0), and every worker runs
    there. The machine's busy time counts them; on a shared machine it counts others' work
    too, which the load average printed beside it shows."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:8]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError):
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


#: ``--exercise NAME ...`` handed to every class run (set by main): grade those exercises only, for a
#: figure on the same exercises as an older tree that had fewer.
ONLY: list[str] = []


def grade(subs: Path, out: Path, jobs: int, seed: int, flags: tuple[str, ...]) -> tuple[float, float]:
    """Wall time and CPU time (:func:`cpu_seconds`) of one class run."""
    one_core = ONE_CORE in flags
    flags = tuple(f for f in flags if f != ONE_CORE)
    core = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = cpu_seconds()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grader", "class", str(subs), "--out", str(out), "--jobs",
                           str(jobs), "--seed", str(seed), "--regrade", "--no-progress", *ONLY, *flags],
                          capture_output=True, text=True, cwd=REPO,
                          preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if one_core else None)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - before
    if proc.returncode != 0:
        raise SystemExit(f"class mode failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, cpu


Config = tuple[int, tuple[str, ...]]  # (jobs, extra class-mode flags)


def marginal_cost(root: Path, *, small: int, large: int, jobs: int, repeats: int, seed: int) -> int:
    """``--slope``: what one more student costs, the slope of class mode's wall time between
    a class of ``small`` and one of ``large`` (class mode's defaults, class report included),
    the two runs interleaved ``repeats`` times and compared by their medians, so that a fixed
    start-up cost and a colleague's burst of load both drop out."""
    big = build_class(root / "large", large)
    little = root / "small" / "submissions"
    for i in range(small):
        shutil.copytree(big / f"student{i:02d}", little / f"student{i:02d}")
    load0 = os.getloadavg()
    runs: dict[int, list[tuple[float, float]]] = {small: [], large: []}
    for _ in range(repeats):
        for n, subs in ((small, little), (large, big)):
            runs[n].append(grade(subs, root / f"out-{n}", jobs, seed, ()))
    load1 = os.getloadavg()
    wall = {n: statistics.median(w for w, _ in rs) for n, rs in runs.items()}
    cpu = {n: statistics.median(c for _, c in rs) for n, rs in runs.items()}
    slope, cpu_slope = ((d[large] - d[small]) / (large - small) for d in (wall, cpu))
    print(f"machine: {os.cpu_count()} cores; load average (1 min) before {load0[0]:.2f}, "
          f"after {load1[0]:.2f}")
    for n in (small, large):
        print(f"class of {n:>4}, jobs={jobs}: wall median {wall[n]:6.1f} s (runs: "
              f"{', '.join(f'{w:.1f}' for w, _ in runs[n])}), CPU median {cpu[n]:6.1f} s")
    goal = "met" if slope <= 0.25 else "not met"
    print(f"marginal cost per student (slope {small} -> {large}): {slope:.3f} s wall, {cpu_slope:.3f} CPU-s; "
          f"goal <= 0.25 s on 2 cores: {goal}; 1,000 students: about {1000 * slope / 60:.1f} min")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16, help="submissions (default 16)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel workers (default: cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="rounds of every setting, interleaved (default 5)")
    p.add_argument("--keep", type=Path, help="build the class here and keep it (default: a temp folder)")
    p.add_argument("--slope", action="store_true",
                   help="only the marginal cost per student: the slope between a class of 16 and of 128")
    p.add_argument("--exercise", action="append", default=[], metavar="NAME",
                   help="grade only this exercise (repeatable; class mode's --exercise)")
    args = p.parse_args()
    ONLY.extend(a for name in args.exercise for a in ("--exercise", name))
    if args.slope:
        with tempfile.TemporaryDirectory(prefix="bench-slope-") as tmp:
            return marginal_cost(Path(tmp), small=16, large=128, jobs=args.jobs, repeats=max(args.repeats, 3),
                                 seed=args.seed)
    J = args.jobs
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-classroom-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        load0 = os.getloadavg()
        subs = build_class(root, args.n)
        t_torch = time_import_torch()  # also warms the file cache before the timed runs
        # Class mode's default, then one core per worker, then a fresh interpreter per student.
        variants = [(), ("--pin",), ("--no-preload",)]
        configs: list[Config] = [(jobs, v) for v in variants for jobs in (1, J)]
        if hasattr(os, "sched_setaffinity"):
            configs.insert(0, (1, (ONE_CORE,)))  # the class on one core: the strong-scaling baseline
        runs: dict[Config, list[tuple[float, float]]] = {c: [] for c in configs}
        # Every setting once per round, so that a colleague's burst of load hits all alike.
        for _ in range(args.repeats):
            for jobs, flags in configs:
                out = root / f"out-{jobs}{''.join(flags)}"
                runs[jobs, flags].append(grade(subs, out, jobs, args.seed, flags))
        # (median wall, median CPU) of each setting
        best = {c: (statistics.median(w for w, _ in rs), statistics.median(u for _, u in rs))
                for c, rs in runs.items()}
        load1 = os.getloadavg()
        peak_mib = peak_memory_one(subs / "student00", args.seed) if sys.platform == "linux" else float("nan")
        with open(root / f"out-{J}" / "grades.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        statuses = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
        full = sum(r["total"] == r["max"] for r in rows)

        buggy = args.n // 4
        print(f"machine: {os.cpu_count()} cores; load average (1 min) before {load0[0]:.2f}, "
              f"after {load1[0]:.2f}")
        print(f"class: {args.n} submissions ({args.n - buggy} correct, {buggy} with planted bugs); "
              f"statuses {statuses}; {full} at full marks")
        print(f"python -c 'import torch': {t_torch:.2f} s (median of 5)")
        print(f"medians of {args.repeats} interleaved rounds; spread: the lowest and highest round")
        head = ("setting", "wall", "per sub.", "CPU/sub.", "cores busy")
        print(f"{head[0]:<24} {head[1]:>7} {head[2]:>9} {head[3]:>9} {head[4]:>10}  wall spread")
        for (jobs, flags), (wall, cpu) in best.items():
            label = " ".join([f"jobs={jobs}", *flags])
            walls = [w for w, _ in runs[jobs, flags]]
            print(f"{label:<24} {wall:6.1f}s {wall / args.n:8.2f}s {cpu / args.n:8.2f}s {cpu / wall:10.2f}  "
                  f"{min(walls):.1f}-{max(walls):.1f} s")

        def ratios(a: Config, b: Config) -> list[float]:
            """a's wall over b's, round by round (both ran in the same round)."""
            return [wa / wb for (wa, _), (wb, _) in zip(runs[a], runs[b])]

        def speedup(a: Config, b: Config) -> float:
            return statistics.median(ratios(a, b))

        def spread(a: Config, b: Config) -> str:
            r = ratios(a, b)
            return f"rounds {min(r):.2f}-{max(r):.2f}x"

        default1, defaultJ = (1, ()), (J, ())
        cores = min(J, os.cpu_count() or J)
        if (1, (ONE_CORE,)) in best:
            # Strong scaling: the same class, the same default settings, on 1 core and on all.
            one = (1, (ONE_CORE,))
            verdict = "met" if speedup(one, defaultJ) >= 1.7 else "not met"
            print(f"speed-up on {cores} cores (jobs={J}) over 1 core (jobs=1, the run confined to one core): "
                  f"{speedup(one, defaultJ):.2f}x ({spread(one, defaultJ)}); "
                  f"goal >= 1.7x on 2 cores: {verdict}")
        print(f"speed-up jobs={J} over jobs=1, both free to use every core: "
              f"{speedup(default1, defaultJ):.2f}x ({spread(default1, defaultJ)}); smaller, as "
              f"one grading at a time already keeps {best[default1][1] / best[default1][0]:.2f} cores busy")
        for flag in ("--pin", "--no-preload"):
            a, b = (1, (flag,)), (J, (flag,))
            print(f"  with {flag}: {speedup(a, b):.2f}x ({spread(a, b)})")
        print(f"class mode's default at jobs={J} vs a fresh `python -m grader` per student (--no-preload), "
              f"jobs={J}: {speedup((J, ('--no-preload',)), defaultJ):.2f}x faster "
              f"({spread((J, ('--no-preload',)), defaultJ)})")
        busy = best[defaultJ][1] / best[defaultJ][0]
        print(f"jobs={J} keeps {busy:.2f} of {cores} cores busy ({busy / cores:.0%}); jobs=1 keeps "
              f"{best[default1][1] / best[default1][0]:.2f} busy (a grading starts its sandbox, a second "
              f"process, while it works)")
        per_sub = best[default1][0] / args.n
        fresh = best[1, ("--no-preload",)][0] / args.n
        print(f"per-submission wall time, jobs=1: {per_sub:.2f} s = {per_sub / t_torch:.2f}x import torch "
              f"(a fresh `python -m grader` each: {fresh:.2f} s = {fresh / t_torch:.2f}x); in a class at "
              f"jobs={J}: {best[defaultJ][0] / args.n:.2f} s = {best[defaultJ][0] / args.n / t_torch:.2f}x")
        print(f"peak memory grading one submission (all its processes): {peak_mib:.0f} MiB")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
