"""Measure what a seeded grading tells a student about its hidden checks: bits per hidden check.

The attack (tests/submissions/correct.py + chooser_tail.py) picks, for every call, one of six
behaviours by a property of the call's inputs (right, wrong values, an extra dimension,
ValueError, NotImplementedError, a forbidden API). Graded under SEEDS secret seeds, each hidden
check's feedback (its status, message and detail, and its exercise's status and message) is
collected; a check whose feedback takes k distinct forms across the seeds tells log2(k) bits
of its case per resubmission (at least: more seeds find more forms). Printed: the largest
number of forms of one hidden check, its bits, how many hidden checks had more than two forms
(pass and fail), and how many exercise lines (status, score, message) differed between two
gradings whose checks passed and failed alike. It also prints how many of the job's
calls the submission found at load (``CALLS``: 0 when nothing of the hidden cases is in reach).

Usage: python scripts/bench_hidden_bits.py [--seeds 3] [--exercise NAME ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = ROOT / "tests" / "submissions"


def attack(folder: Path) -> Path:
    """The chooser: the course's correct answers, each wrapped to choose a behaviour per case."""
    path = folder / "chooser.py"
    tail = (SUBMISSIONS / "chooser_tail.py").read_text()
    path.write_text((SUBMISSIONS / "correct.py").read_text() + "\n\n" + tail)
    return path


def grade(path: Path, seed: int, out: Path, exercises: list[str]) -> tuple[dict, str]:
    """results.json and the terminal's text of one seeded grading of ``path``."""
    env = {**os.environ, "GRADER_SEED": str(seed), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "grader", str(path), "--json", str(out), "--verbose", "--timeout", "60"]
    for name in exercises:
        cmd += ["--exercise", name]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if p.returncode not in (0, 1):
        raise SystemExit(f"grading failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(out.read_text()), p.stdout + p.stderr


def feedback(results: dict) -> dict[str, tuple[tuple[bool, ...], str, dict[str, str]]]:
    """Per exercise: its checks' pass/fail, its own line (status, score, message), and what each
    hidden check's block says."""
    out = {}
    for test in results["tests"]:
        blocks = re.split(r"\n(?=[✓✗–] )", test.get("output", ""))
        head = blocks[0] if blocks else ""
        checks = {}
        passed = []
        for block in blocks[1:]:
            first = block.split("\n")[0]
            passed.append(first.startswith("✓"))
            if " (hidden)" in first:
                checks[first[2:].split(" (hidden)")[0]] = block
        out[test["name"]] = (tuple(passed), head + f" [{test.get('score')}/{test.get('max_score')}]", checks)
    return out


def measure(seeds: list[int], exercises: list[str]) -> dict:
    """Forms of each hidden check's block over the seeds, and exercise lines that say more than
    their checks' pass/fail (two lines for one pass/fail vector)."""
    forms: dict[str, set[str]] = defaultdict(set)
    heads: dict[tuple[str, tuple[bool, ...]], set[str]] = defaultdict(set)
    calls = []
    with tempfile.TemporaryDirectory(prefix="hidden-bits-") as tmp:
        path = attack(Path(tmp))
        for i, seed in enumerate(seeds):
            results, text = grade(path, seed, Path(tmp) / f"r{i}.json", exercises)
            calls += re.findall(r"CALLS (\d+)", text)
            for name, (vector, head, checks) in feedback(results).items():
                heads[(name, vector)].add(head)
                for check, said in checks.items():
                    forms[f"{name}: {check}"].add(said)
    most = max((len(v) for v in forms.values()), default=0)
    bits = math.log2(most) if most else 0.0
    return {"hidden_checks": len(forms), "most_forms": most, "bits_per_check": bits,
            "over_one_bit": sum(len(v) > 2 for v in forms.values()),
            "heads_over": sum(len(v) > 1 for v in heads.values()), "calls_at_load": sorted(set(calls))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--exercise", action="append", default=[])
    args = p.parse_args()
    seeds = [int.from_bytes(os.urandom(16), "big") for _ in range(args.seeds)]
    m = measure(seeds, args.exercise)
    print(f"hidden checks seen: {m['hidden_checks']}; most forms of one hidden check's feedback over "
          f"{args.seeds} seeds: {m['most_forms']} ({m['bits_per_check']:.2f} bits per hidden check per "
          f"resubmission); hidden checks with more than pass/fail: {m['over_one_bit']}; exercise lines "
          f"that say more than their checks' pass/fail: {m['heads_over']}; calls in reach at load: "
          f"{', '.join(m['calls_at_load']) or 'not printed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
