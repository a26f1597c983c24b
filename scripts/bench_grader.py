"""How fast is the grader? Prints figures; asserts nothing.

Two goals, measured here on this machine (CPU):

1. ``python -m grader SUBMISSION`` for a complete submission of all thirteen
   exercises takes at most 3x the wall time of ``python -c "import torch"``.
2. The in-notebook ``check`` of one exercise takes at most 0.3 s after the first call.

    python scripts/bench_grader.py                        # tests/submissions/correct.py
    python scripts/bench_grader.py solutions/ --repeat 5  # the solution notebooks

Each figure is the median of ``--repeat`` runs, interleaved (torch, grader,
torch, grader, ...) so that a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests" / "submissions" / "correct.py"


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def bench_cli(submission: Path, repeat: int) -> None:
    results = Path(tempfile.mkdtemp()) / "results.json"
    torch_s, grade_s = [], []
    grader = [sys.executable, "-m", "grader", str(submission), "--json", str(results), "--quiet"]
    wall([sys.executable, "-c", "import torch"])  # warm the file cache for both
    for _ in range(repeat):
        torch_s.append(wall([sys.executable, "-c", "import torch"]))
        grade_s.append(wall(grader))
    data = json.loads(results.read_text())
    t, g = statistics.median(torch_s), statistics.median(grade_s)
    print(f"submission: {submission.relative_to(ROOT) if submission.is_relative_to(ROOT) else submission}")
    print(f"score: {data['score']:g} / {data['max_score']:g} ({len(data['tests'])} exercises)")
    print(f"python -c 'import torch':  median {t:.2f} s  (runs: {', '.join(f'{x:.2f}' for x in torch_s)})")
    print(f"python -m grader:          median {g:.2f} s  (runs: {', '.join(f'{x:.2f}' for x in grade_s)})")
    print(f"ratio grader / import torch: {g / t:.2f}  (goal: <= 1.25)")


def bench_notebook(repeat: int) -> None:
    code = f"""
import importlib.util, time, io, contextlib, statistics
spec = importlib.util.spec_from_file_location("sub", {str(DEFAULT)!r})
sub = importlib.util.module_from_spec(spec); spec.loader.exec_module(sub)
from grader import check
with contextlib.redirect_stdout(io.StringIO()):
    t = time.perf_counter(); check(sub.causal_mask); very_first = time.perf_counter() - t
print(f"very first check in a fresh process (imports the checks): {{very_first:.3f}} s")
from grader.checks import EXERCISES
first, later = {{}}, {{}}
for name in EXERCISES:
    fn = getattr(sub, name)
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter(); check(fn); first[name] = time.perf_counter() - t
        runs = []
        for _ in range({repeat}):
            t = time.perf_counter(); check(fn); runs.append(time.perf_counter() - t)
    later[name] = statistics.median(runs)
for name in EXERCISES:
    print(f"check({{name}}): first {{first[name]:.3f}} s, then median {{later[name]:.3f}} s")
print(f"slowest check after the first call: {{max(later.values()):.3f}} s  (goal: <= 0.30)")
"""
    print(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout, end="")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submission", nargs="?", type=Path, default=DEFAULT)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip-notebook", action="store_true")
    args = p.parse_args()
    bench_cli(args.submission.resolve(), args.repeat)
    if not args.skip_notebook:
        print()
        bench_notebook(args.repeat)


if __name__ == "__main__":
    main()
