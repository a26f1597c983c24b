"""How fast is the grader? Prints figures; asserts nothing.

The goals, measured here on this machine (CPU):

1. ``python -m grader SUBMISSION`` takes at most 1.25x the wall time of
   ``python -c "import torch"``: for all the exercises of the contract in one folder
   (``solutions/``), and for one chapter's notebook.
2. Grading one file is not slower than grading a folder that holds only that file.
3. The in-notebook ``check`` answers within 0.5 s the first time, after the notebook's
   own ``import torch`` (which it pays anyway), and within 0.3 s after that; in the
   course (computed with the reference) and in the student template (the public checks
   recorded as data).

    python scripts/bench_grader.py                          # all of it
    python scripts/bench_grader.py --repeat 7 --skip-notebook
    python scripts/bench_grader.py --by-exercise            # where the time goes (issue 50)
    python scripts/bench_grader.py --by-exercise tests/submissions/correct.py --repeat 3

``--by-exercise`` grades ``solutions/`` (or the submissions named) with ``--timing`` and prints
each exercise's cost, sorted, with its share of all the exercises' CPU (its checks built, its
calls made in the worker, its outcomes judged: :mod:`grader.timing`), then each chapter's, the
figure the grader guide's budget is stated in; with ``--repeat N``, the median of N gradings.

Each grading figure is the median of ``--repeat`` runs, interleaved (torch, folder,
chapter, one file, torch, ...) so that a busy machine slows all alike, with the
spread (lowest-highest) and, for ratios, the range of the rounds' paired ratios.
Each exercise's first ``check`` runs in a fresh process, after ``import torch``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORRECT = ROOT / "tests" / "submissions" / "correct.py"
CHAPTER = "ex02_softmax.ipynb"  # three exercises, the attention among them


def wall(argv: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (spread {min(xs):.2f}-{max(xs):.2f})"


def _ratio(a: list[float], b: list[float]) -> str:
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):.2f} (rounds {min(r):.2f}-{max(r):.2f})"


def bench_cli(repeat: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    alone = tmp / "alone"
    alone.mkdir()
    shutil.copy2(ROOT / "solutions" / CHAPTER, alone / CHAPTER)
    results = tmp / "solutions.json"  # the other gradings write their own: this one's score is printed

    def grader(path: Path, out: Path) -> list[str]:
        return [sys.executable, "-m", "grader", str(path), "--json", str(out), "--quiet"]

    runs = {
        "import torch": [sys.executable, "-c", "import torch"],
        "solutions/ (every exercise)": grader(ROOT / "solutions", results),
        f"one chapter ({CHAPTER})": grader(alone / CHAPTER, tmp / "chapter.json"),
        "a folder holding only that notebook": grader(alone, tmp / "folder.json"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    wall(runs["import torch"])  # warm the file cache for all
    for _ in range(repeat):
        for name, argv in runs.items():
            times[name].append(wall(argv))
    data = json.loads(results.read_text())
    print(f"solutions/: {data['score']:g} / {data['max_score']:g} ({len(data['tests'])} exercises); "
          f"{repeat} interleaved rounds")
    for name, xs in times.items():
        print(f"  {name:<38} {_spread(xs)}")
    torch_s = times["import torch"]
    for name in list(runs)[1:3]:
        print(f"ratio {name} / import torch: {_ratio(times[name], torch_s)}  (goal: <= 1.25)")
    print(f"ratio one file / the folder holding it: "
          f"{_ratio(times[list(runs)[2]], times[list(runs)[3]])}  (goal: <= 1)")
    shutil.rmtree(tmp, ignore_errors=True)


FIRST_CHECK = """
import contextlib, io, statistics, sys, time, importlib.util
t = time.perf_counter()
import torch
torch_s = time.perf_counter() - t
spec = importlib.util.spec_from_file_location("sub", {submission!r})
sub = importlib.util.module_from_spec(spec); spec.loader.exec_module(sub)
from grader import check
fn = getattr(sub, {name!r})
with contextlib.redirect_stdout(io.StringIO()) as out:
    t = time.perf_counter(); check(fn); first = time.perf_counter() - t
    later = []
    for _ in range({repeat}):
        t = time.perf_counter(); check(fn); later.append(time.perf_counter() - t)
print(torch_s, first, statistics.median(later), "attnmask" in sys.modules, out.getvalue().splitlines()[0])
"""


def bench_notebook(repeat: int, where: Path, env: dict, label: str) -> None:
    """Each exercise's first check() in a fresh process (after import torch), then later ones' median."""
    import attnmask

    print(f"\ncheck() in {label} (a fresh process per exercise, after its own import torch):")
    firsts, laters, reference = [], [], set()
    for name in attnmask.CONTRACT:
        code = FIRST_CHECK.format(submission=str(CORRECT), name=name, repeat=repeat)
        out = subprocess.run([sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True,
                             check=True).stdout.split(maxsplit=4)
        torch_s, first, later, imported, said = float(out[0]), float(out[1]), float(out[2]), out[3], out[4]
        firsts.append(first)
        laters.append(later)
        reference.add(imported)
        print(f"  {name:<26} import torch {torch_s:.2f} s; first check {first:.3f} s, then median "
              f"{later:.3f} s  ({said.strip()})")
    print(f"  first check: median {statistics.median(firsts):.3f} s, slowest {max(firsts):.3f} s "
          f"(goal: <= 0.5); later: slowest median {max(laters):.3f} s (goal: <= 0.3); "
          f"attnmask imported: {', '.join(sorted(reference))}")


#: Chapter 13's exercises run Triton's interpreter on a CPU: their budget is counted apart.
TRITON_CHAPTER = 13
#: The columns of the table: (heading, the figure in a timing file's exercise entry).
COLUMNS = [("build", lambda e: e["build"]), ("run pub", lambda e: e["run"]["public"]),
           ("run hid", lambda e: e["run"]["hidden"]), ("judge pub", lambda e: e["judge"]["public"]),
           ("judge hid", lambda e: e["judge"]["hidden"])]


def timed_grading(submission: Path, tmp: Path) -> tuple[dict, float, float]:
    """(the timing file, the wall seconds, the grading process's CPU seconds) of one grading.
    The CPU is the grading process's alone: a process in bubblewrap never adds its CPU to its
    parent's (see bench_classroom.cpu_seconds); the worker's is in the timing file's "run"."""
    timing, results = tmp / "timing.json", tmp / "results.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = wall([sys.executable, "-m", "grader", str(submission), "--json", str(results),
                    "--timing", str(timing), "--quiet"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    data = json.loads(timing.read_text())
    data["score"] = json.loads(results.read_text())["score"]
    return data, seconds, cpu


def _median_entry(entries: list[dict]) -> dict:
    """The median, figure by figure, of one exercise's entries over several gradings."""
    out = {"chapter": entries[0]["chapter"]}
    for heading, pick in [("total", lambda e: e["total"]), *COLUMNS]:
        out[heading] = {k: statistics.median(pick(e)[k] for e in entries) for k in ("wall", "cpu")}
    return out


def bench_by_exercise(submissions: list[Path], repeat: int) -> None:
    """Each exercise's cost, sorted, with its share; then each chapter's (CPU milliseconds)."""
    tmp = Path(tempfile.mkdtemp())
    for submission in submissions:
        wall([sys.executable, "-c", "import torch"])  # warm the file cache
        runs, walls, cpus, torch_s = [], [], [], []
        for _ in range(repeat):
            torch_s.append(wall([sys.executable, "-c", "import torch"]))
            data, seconds, cpu = timed_grading(submission, tmp)
            runs.append(data)
            walls.append(seconds)
            cpus.append(cpu)
        names = list(runs[0]["exercises"])
        rows = {n: _median_entry([r["exercises"][n] for r in runs]) for n in names}
        whole = sum(r["total"]["cpu"] for r in rows.values())
        print(f"\n{submission.relative_to(ROOT) if submission.is_relative_to(ROOT) else submission}: "
              f"score {runs[0]['score']:g}; {repeat} grading(s), medians; CPU and wall in ms")
        heads = "".join(f"{h:>11}" for h, _ in COLUMNS)
        print(f"  {'exercise':<27}{'ch':>3}{'CPU':>8}{'share':>7}{'wall':>8}{heads}   (each column CPU)")
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["total"]["cpu"]):
            cols = "".join(f"{1000 * r[h]['cpu']:>11.0f}" for h, _ in COLUMNS)
            print(f"  {name:<27}{r['chapter']:>3}{1000 * r['total']['cpu']:>8.0f}"
                  f"{100 * r['total']['cpu'] / whole:>6.1f}%{1000 * r['total']['wall']:>8.0f}{cols}")
        print(f"  {'all exercises':<30}{1000 * whole:>8.0f}{100:>6.1f}%"
              f"{1000 * sum(r['total']['wall'] for r in rows.values()):>8.0f}")
        by_chapter: dict[int, list[float]] = {}
        for r in rows.values():
            by_chapter.setdefault(r["chapter"], []).append(r["total"]["cpu"])
        print("  per chapter (CPU ms: all its exercises; the costliest one; chapter 13 is Triton's "
              "interpreter, counted apart):")
        for chapter, costs in sorted(by_chapter.items()):
            apart = "  (Triton interpreter)" if chapter == TRITON_CHAPTER else ""
            print(f"    chapter {chapter:>2}: {1000 * sum(costs):7.0f} ms over {len(costs):>2} exercises, "
                  f"costliest {1000 * max(costs):6.0f} ms, {100 * sum(costs) / whole:5.1f}%{apart}")
        phases = list(dict.fromkeys(p for r in runs for p in r["phases"]))
        print("  outside the exercises' checks, by phase (the grading process's clocks; in class mode, "
              "forked from a process that imported everything, the per-student overhead):")
        for phase in phases:
            spent = [r["phases"].get(phase, {"wall": 0.0, "cpu": 0.0}) for r in runs]
            print(f"    {phase:<16} wall {1000 * statistics.median(s['wall'] for s in spent):7.0f} ms, "
                  f"CPU {1000 * statistics.median(s['cpu'] for s in spent):7.0f} ms")
        print(f"  the grading: wall {statistics.median(walls):.2f} s (import torch "
              f"{statistics.median(torch_s):.2f} s, ratio {_ratio(walls, torch_s)}); the grading "
              f"process's CPU {statistics.median(cpus):.2f} s (imports, sandbox, building and judging; "
              f"the worker's CPU is in the run columns)")
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 5; 1 with --by-exercise)")
    p.add_argument("--skip-cli", action="store_true")
    p.add_argument("--skip-notebook", action="store_true")
    p.add_argument("--by-exercise", nargs="*", type=Path, metavar="SUBMISSION",
                   help="only where the time goes, per exercise and chapter (default: solutions/)")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if args.by_exercise is not None:
        bench_by_exercise([p.resolve() for p in args.by_exercise] or [ROOT / "solutions"], args.repeat or 1)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        return
    args.repeat = args.repeat or 5
    if not args.skip_cli:
        bench_cli(args.repeat)
    if not args.skip_notebook:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        bench_notebook(args.repeat, ROOT, env, "the course (the reference computes the public checks)")
        from grader.runners.platforms.github import build_template

        tmp = Path(tempfile.mkdtemp())
        template = build_template(ROOT, tmp / "template")
        blocker = tmp / "blocker"
        blocker.mkdir()
        (blocker / "attnmask.py").write_text("raise ImportError('not in the student template')\n")
        env = {**env, "PYTHONPATH": os.pathsep.join([str(blocker), str(template)])}
        bench_notebook(args.repeat, template, env,
                       "the student template (the public checks recorded as data)")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
