"""``python -m grader merge OUT... --out grades/``: one class from the shards that graded it.

Each shard's ``--out`` folder holds ``class-run.json`` (:mod:`~grader.runners.classmode.shards`) and
one folder per student. The merge refuses shards that were graded differently (another
grader, exercise list, options, roster or late policy, or seed: the seeds are compared by
their keyed hashes, never read), then rebuilds every row's scores from that student's
``results.json``, copies the students' folders into ``--out`` and writes ``grades.csv``,
``class-run.json`` and the class report there, as one run of the whole class would.

A shard's folder is data anyone with it could have written, so the merge also holds it to what a
class run writes (:func:`check_rows`): one row and one folder per student within a shard, a
folder that is the student's own (its name derived from theirs, used by no other row), and
points that are finite and within each exercise's maximum (the maxima the shards recorded, which
must agree). Anything else refuses the whole merge, naming the shard and the row.

Every student that some shard saw must have exactly one row. Missing students (a shard
that failed or was not passed) and duplicates (the same shard passed twice, or two runs
with different shard counts) are listed, and the merge exits 1 without writing grades
unless ``--allow-partial`` is given, in which case the missing get a row that says so.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import safetext
from . import shards
from .classrun import write_outputs
from .roster import slug_of
from .scores import exercise_of, isolation, max_score, per_exercise, read_results, total_score

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


def class_maxima(records: list[tuple[Path, dict[str, Any]]]) -> dict[str, float]:
    """Each exercise's maximum as the shards recorded it; a SystemExit where two shards differ."""
    maxima: dict[str, tuple[float, Path]] = {}
    for d, r in records:
        for ex, top in (r.get("maxima") or {}).items():
            if not isinstance(top, (int, float)) or not math.isfinite(top) or top < 0:
                raise SystemExit(f"refusing to merge: the shard {d} records the maximum of {ex!r} as {top!r}")
            if ex in maxima and maxima[ex][0] != top:
                raise SystemExit(f"refusing to merge: the shards {maxima[ex][1]} and {d} give {ex!r} "
                                 f"different maxima ({maxima[ex][0]:g} and {top:g}): grade them with one "
                                 "grader")
            maxima.setdefault(ex, (float(top), d))
    return {ex: top for ex, (top, _) in maxima.items()}


def _points_problem(results: dict[str, Any], exercises: Sequence[str],
                    maxima: dict[str, float]) -> str | None:
    """Why a student's results.json cannot be a class run's (points out of range), else None."""
    for t in results.get("tests") or []:
        ex = exercise_of(str(t.get("name", "")), exercises) if isinstance(t, dict) else None
        if ex is None:
            return f"a test that is no exercise of the class ({str(t)[:80]!r})"
        score, top = t.get("score"), t.get("max_score")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                   for x in (score, top)):
            return f"{ex}: points {score!r} of {top!r} are not finite numbers"
        if ex in maxima and (top != maxima[ex] or not 0 <= score <= top + 1e-9):
            return f"{ex}: {score!r} of {top!r}, where the class's maximum is {maxima[ex]:g}"
    total = results.get("score", 0)
    if not isinstance(total, (int, float)) or not math.isfinite(total):
        return f"a total of {total!r}"
    return None


def check_rows(d: Path, record: dict[str, Any], maxima: dict[str, float]) -> None:
    """One shard's rows as a class run writes them (see the module); a SystemExit names the row."""
    seen: dict[str, int] = {}
    for i, row in enumerate(map(_row, record.get("rows") or [])):
        where = f"the shard {d}, row {i + 1} ({row['student']!r})"
        key = str(row.get("id") or row["student"])
        if key in seen:
            raise SystemExit(f"refusing to merge: {where} repeats the student of row {seen[key] + 1}; a "
                             "class run writes one row per student")
        seen[key] = i
        total = row.get("total", 0.0)
        if not isinstance(total, (int, float)) or not math.isfinite(total):
            raise SystemExit(f"refusing to merge: {where} has the total {total!r}")
        slug = str(row.get("slug") or "")
        if not slug:
            continue
        base = slug_of(row["student"])
        if "\\" not in row["student"] and slug != base and not re.fullmatch(re.escape(base) + r"-\d+", slug):
            raise SystemExit(f"refusing to merge: {where} names the folder {slug!r}, which is not this "
                             f"student's (class mode would name it {base!r})")
        results = read_results(d / slug / "results.json") if safetext.component(slug) else None
        problem = _points_problem(results, record.get("exercises") or [], maxima) if results else None
        if problem:
            raise SystemExit(f"refusing to merge: {where}: its results.json has {problem}")


def _one_folder_each(records: list[tuple[Path, dict[str, Any]]]) -> None:
    """No two rows of the merge write the same folder of --out."""
    owner: dict[str, str] = {}
    for d, r in records:
        for row in map(_row, r.get("rows") or []):
            slug = str(row.get("slug") or "")
            if not slug:
                continue
            who = f"{row['student']!r} of the shard {d}"
            if slug in owner and owner[slug] != who:
                raise SystemExit(f"refusing to merge: {owner[slug]} and {who} both name the folder {slug!r}")
            owner[slug] = who


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
    maxima = class_maxima(records)
    for d, r in records:
        check_rows(d, r, maxima)
    distinct = {d.resolve() for d, _ in records}
    if len(distinct) == len(records):  # the same shard passed twice is the duplicates' case below
        _one_folder_each(records)
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
                            "submitted": "", "submitted_from": "", "due": "",
                            "id": name if name in names else "",
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
