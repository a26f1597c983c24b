"""Gradebook exports: a class run's (or a merge's) grades as an LMS imports them.

``python -m grader export GRADES_DIR --format canvas|moodle|csv [--roster R] [--out FILE]``
reads ``GRADES_DIR/class-run.json`` (what ``python -m grader class`` and ``merge`` write)
and writes one CSV file. The points are the final ones, late penalty taken off, out of
the assignment's maximum.

* ``canvas``: Canvas's gradebook import columns, ``Student``, ``ID``, ``SIS User ID``,
  ``SIS Login ID``, ``Section``, then one column per assignment (``--assignment``, as the
  assignment is called in Canvas; ``Name (1234)`` with its Canvas id matches it exactly).
  With ``--roster`` a Canvas gradebook export (those five columns, as Canvas writes them) says
  who is who: a graded student is matched by SIS Login ID, SIS User ID, ID, then name,
  against the class run's folder name and its roster's id and name. Without one, each row
  carries the folder name as ``Student`` and ``SIS Login ID``, which Canvas matches on.
* ``moodle``: Moodle's grade import, an identifier column and a grade column; at import,
  map ``identifier`` to the user field it holds (username, ID number or email address).
  The identifier is the class roster's id when the run had a roster, else the folder name.
* ``csv``: ``student``, ``id``, ``name``, ``score``, ``max``, ``status``: for anything else.

Every cell goes through :func:`~grader.runners.classmode.sheets.cell`: a student's folder name
is theirs to choose.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..classmode import shards, sheets
from ..classmode.scores import _fmt

FORMATS = ("canvas", "moodle", "csv")
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_ID = "identifier"
DEFAULT_ASSIGNMENT = "Attention masks"


def _norm(text: Any) -> str:
    return str(text or "").strip().lower()


def canvas_roster(path: Path) -> list[dict[str, str]]:
    """A Canvas gradebook export's students (its "Points Possible" line and test student left out)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise SystemExit(f"cannot read the roster {path}: {e}") from None
    rows = list(csv.DictReader(text.splitlines()))
    header = set(rows[0].keys()) if rows else set()
    if not set(CANVAS_COLUMNS) <= header:
        raise SystemExit(f"the roster {path} has columns {sorted(h for h in header if h)}; a Canvas export "
                         f"was expected, with {', '.join(CANVAS_COLUMNS)} (Grades > Export > CSV).")
    return [{k: (r.get(k) or "").strip() for k in CANVAS_COLUMNS} for r in rows
            if (r.get("Student") or "").strip() not in ("", "Points Possible", "Student, Test")]


def _graded_keys(row: dict[str, Any], norm=_norm) -> set[str]:
    return {norm(row.get(k)) for k in ("student", "id", "name")} - {""}


def _exact(text: Any) -> str:
    return str(text or "").strip()


def _match(person: dict[str, str], graded: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The graded row of a Canvas roster entry: an exact match of its login, SIS id, id or name
    first; else the one row that matches ignoring case. Two rows that both match are refused,
    both named: taking the first would give one student the other's grade."""
    for norm in (_exact, _norm):
        for key in ("SIS Login ID", "SIS User ID", "ID", "Student"):
            want = norm(person[key])
            hits = [r for r in graded if want and want in _graded_keys(r, norm)]
            if len(hits) > 1:
                raise SystemExit(f"the Canvas roster's {person['Student']!r} ({key} {person[key]!r}) matches "
                                 f"{len(hits)} graded rows: {', '.join(repr(r['student']) for r in hits)}; "
                                 "nothing was written. One folder per student, named as in Canvas.")
            if hits:
                return hits[0]
    return None


def canvas(record: dict[str, Any], assignment: str, roster: list[dict[str, str]] | None
           ) -> tuple[list[str], list[list[Any]], list[str]]:
    """(header, rows, notes): the Canvas import file."""
    header = [*CANVAS_COLUMNS, assignment]
    rows, notes = [], []
    if roster is None:
        for r in record["rows"]:
            rows.append([r["student"], "", r.get("id", ""), r["student"], "", _fmt(r["total"])])
        return header, rows, notes
    graded = list(record["rows"])
    for person in roster:
        hit = _match(person, graded)
        if hit is None:
            notes.append(person["Student"])
            score = ""  # Canvas leaves a blank cell as it was
        else:
            graded.remove(hit)
            score = _fmt(hit["total"])
        rows.append([*(person[k] for k in CANVAS_COLUMNS), score])
    if graded:
        notes += [f"{r['student']} (graded, not in the Canvas roster)" for r in graded]
    return header, rows, notes


def moodle(record: dict[str, Any], assignment: str) -> tuple[list[str], list[list[Any]], list[str]]:
    rows = [[r.get("id") or r["student"], _fmt(r["total"])] for r in record["rows"]]
    return [MOODLE_ID, assignment], rows, []


def plain(record: dict[str, Any]) -> tuple[list[str], list[list[Any]], list[str]]:
    maxes = [r["max"] for r in record["rows"] if r.get("max") is not None]
    top = statistics.mode(maxes) if maxes else None  # a missing student's maximum is the class's
    rows = [[r["student"], r.get("id", ""), r.get("name", ""), _fmt(r["total"]),
             _fmt(r["max"] if r.get("max") is not None else top), r["status"]] for r in record["rows"]]
    return ["student", "id", "name", "score", "max", "status"], rows, []


def export(grades: Path, fmt: str, out: Path, *, assignment: str = DEFAULT_ASSIGNMENT,
           roster: Path | None = None) -> list[str]:
    """Write the export; returns notes for the instructor (who was not matched)."""
    record = shards.read_record(grades)
    if fmt == "canvas":
        header, rows, notes = canvas(record, assignment, canvas_roster(roster) if roster else None)
    elif roster is not None:
        raise SystemExit("--roster is read for --format canvas only (the class run's own roster, given to "
                         "`python -m grader class --roster`, already names moodle's and csv's students).")
    elif fmt == "moodle":
        header, rows, notes = moodle(record, assignment)
    else:
        header, rows, notes = plain(record)
    sheets.write(out, header, rows)
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader export",
                                description="Write a class run's grades as a gradebook import file.")
    p.add_argument("grades", type=Path, metavar="GRADES_DIR",
                   help="the --out folder of `python -m grader class` or `merge` (holds class-run.json)")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", type=Path, help="the file to write (default: GRADES_DIR/FORMAT.csv)")
    p.add_argument("--assignment", default=DEFAULT_ASSIGNMENT,
                   help="the assignment's name in the gradebook (default %(default)r)")
    p.add_argument("--roster", type=Path, help="canvas: the course's gradebook export from Canvas")
    args = p.parse_args(argv)
    out = args.out or args.grades / f"{args.format}.csv"
    notes = export(args.grades, args.format, out, assignment=args.assignment, roster=args.roster)
    print(f"{args.format} import file written to {out}")
    if notes:
        print(f"note: {len(notes)} not matched (no grade written for them): {', '.join(notes[:10])}"
              f"{' …' if len(notes) > 10 else ''}", file=sys.stderr)
    return 0
