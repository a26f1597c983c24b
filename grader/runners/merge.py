"""``python -m grader merge OUT... --out grades/``: one class from the shards that graded it.

Each shard's ``--out`` folder holds ``class-run.json`` (:mod:`~grader.runners.shards`) and
one folder per student. The merge refuses shards that were graded differently (another
grader, exercise list, options, roster or late policy, or seed: the seeds are compared by
their keyed hashes, never read), then rebuilds every row's scores from that student's
``results.json``, copies the students' folders into ``--out`` and writes ``grades.csv``,
``class-run.json`` and the class report there, as one run of the whole class would.

Every student that some shard saw must have exactly one row. Missing students (a shard
that failed or was not passed) and duplicates (the same shard passed twice, or two runs
with different shard counts) are listed, and the merge exits 1 without writing grades
unless ``--allow-partial`` is given, in which case the missing get a row that says so.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import safetext
from . import shards
from .classrun import write_outputs
from .scores import isolation, max_score, per_exercise, read_results, total_score

#: What every shard of one class must agree on, with the words for a refusal.
AGREE = (("grader", "grader version (its sources' fingerprint)"), ("exercises", "exercise list"),
         ("options", "grading options"), ("seed_tag", "seed (compared by keyed hash)"),
         ("settings", "roster, due date or late policy"))


def _names(items: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" … ({len(items)} in all)" if len(items) > limit else "")


def _row(row: Any) -> dict[str, Any]:
    """A row of a shard's record with its names made safe to show (:mod:`grader.safetext`): a
    record is a file anyone with the shard's folder could have written. Its slug is checked
    where it is used: one folder inside the shard, never a path."""
    row = dict(row) if isinstance(row, dict) else {"status": "crashed", "message": "an unreadable row"}
    row["student"] = safetext.name(row.get("student", "?"))
    if row.get("id"):
        row["id"] = safetext.name(row["id"])
    return row


def check_agreement(records: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Why these records cannot be merged (empty when they can)."""
    problems = []
    first_dir, first = records[0]
    for key, words in AGREE:
        differ = [str(d) for d, r in records[1:] if r.get(key) != first.get(key)]
        if differ:
            problems.append(f"a different {words} from {first_dir}: {_names(differ)}")
    counts = {r["shard"][1] if r.get("shard") else 1 for _, r in records}
    if len(counts) > 1:
        problems.append(f"shards of different splits (N = {sorted(counts)}): merge the shards of one run")
    return problems


def merge(dirs: Sequence[Path], out: Path, *, allow_partial: bool = False, report: bool = True
          ) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """Merge the shard folders ``dirs`` into ``out``. Returns the merged record (None when the
    merge was refused for missing or duplicate students), the missing and the duplicates."""
    records = [(d, shards.read_record(d)) for d in dirs]
    problems = check_agreement(records)
    if problems:
        raise SystemExit("refusing to merge shards graded differently:\n  " + "\n  ".join(problems))
    first = records[0][1]
    exercises = first["exercises"]
    everyone: dict[str, None] = {}  # in the order the shards list them
    for _, r in records:
        everyone.update(dict.fromkeys(safetext.name(n) for n in r["class"]))
    rows: dict[str, tuple[Path, dict[str, Any]]] = {}
    duplicates: list[str] = []
    for d, r in records:
        for row in map(_row, r["rows"]):
            key = row.get("id") or row["student"]  # a roster student by id, anyone else by name
            if key in rows:
                duplicates.append(f"{key} (in {rows[key][0]} and {d})")
                continue
            rows[key] = (d, row)
    missing = [name for name in everyone if name not in rows]
    count = first["shard"][1] if first.get("shard") else 1
    seen = {r["shard"][0] for _, r in records if r.get("shard")}
    absent = [f"{i}/{count}" for i in range(count) if i not in seen] if first.get("shard") else []
    if (missing or duplicates) and not allow_partial:
        return None, missing, duplicates
    if absent:
        print(f"note: no folder of shard(s) {', '.join(absent)} was given", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    merged_rows = []
    for name in sorted(rows):
        d, row = rows[name]
        row = dict(row)
        if row.get("slug") and (not safetext.component(row["slug"]) or (d / row["slug"]).is_symlink()):
            row.update(slug="", status="crashed", total=0.0, scores={},
                       message=f"the shard {d} names an unsafe folder for this student: grade it again")
        if row.get("slug"):
            src, dst = d / row["slug"], out / row["slug"]
            if src.resolve() != dst.resolve():
                shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
            results = read_results(dst / "results.json")
            if results is None and row["status"] != "missing":
                row.update(status="crashed", total=0.0, scores={},
                           message=f"the shard {d} has no readable results.json for this student")
            elif results is not None:
                penalty = float(row.get("penalty", 0.0) or 0.0)
                row.update(scores=per_exercise(results, exercises), max=max_score(results),
                           isolation=isolation(results))
                row["total"] = round(total_score(results) - penalty, 2)
                if "raw" in row:
                    row["raw"] = total_score(results)
        merged_rows.append(row)
    roster = first.get("settings", {}).get("roster") or []  # [id, name, ...] rows
    names = {entry[0]: entry[1] for entry in roster}
    for name in missing:
        merged_rows.append({"student": name, "slug": "", "status": "not merged", "total": 0.0, "max": None,
                            "scores": {}, "seconds": 0.0, "raw": 0.0, "penalty": 0.0, "days_late": 0.0,
                            "submitted": "", "due": "", "id": name if name in names else "",
                            "name": names.get(name, ""),
                            "message": "no shard given to the merge graded this student"})
    # the order of one run: the roster's, then everyone else by name
    order = {entry[0]: i for i, entry in enumerate(roster)}
    merged_rows.sort(key=lambda r: (order.get(r.get("id") or r["student"], len(order)), r["student"]))
    record = {**first, "shard": None, "rows": merged_rows, "class": list(everyone),
              "shards": [{"folder": str(d), "shard": r.get("shard"), "wall_seconds": r.get("wall_seconds")}
                         for d, r in records],
              "wall_seconds": max(float(r.get("wall_seconds") or 0) for _, r in records)}
    write_outputs(out, record, report=report)
    return record, missing, duplicates


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m grader merge",
        description="Merge the --out folders of a sharded class run (python -m grader class --shard i/N) "
                    "into one: grades.csv, class-run.json and the class report, as one run of the whole "
                    "class.")
    p.add_argument("shards", nargs="+", type=Path, metavar="OUT", help="the shards' --out folders")
    p.add_argument("--out", type=Path, required=True, help="where the merged grades go")
    p.add_argument("--allow-partial", action="store_true",
                   help="write grades even when students are missing or graded twice (they are listed)")
    p.add_argument("--no-report", action="store_true", help="no class-report.html / class-report.md")
    args = p.parse_args(argv)
    record, missing, duplicates = merge(args.shards, args.out, allow_partial=args.allow_partial,
                                        report=not args.no_report)
    if missing:
        print(f"{len(missing)} students have no row in any shard given: {_names(missing, 50)}",
              file=sys.stderr)
    if duplicates:
        print(f"{len(duplicates)} students are in more than one shard: {_names(duplicates, 50)}",
              file=sys.stderr)
    if record is None:
        print("no grades written: pass every shard's folder (or --allow-partial to write what there is).",
              file=sys.stderr)
        return 1
    rows = record["rows"]
    print(f"merged {len(record['shards'])} folders: {len(rows)} students -> {args.out / 'grades.csv'}")
    return 0
