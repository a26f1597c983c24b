"""What class mode does around the gradings: the shard, the roster and the late policy
before, and after them grades.csv, ``class-run.json`` and the class report.

:class:`Plan` is made from the command line (:func:`plan_from`); class mode hands its
:meth:`Plan.select` the students it found and grades only those it returns;
:func:`finish` then turns the rows into the outputs. A merge of shards
(:mod:`~grader.runners.classmode.merge`) calls :func:`write_outputs` on the rows of all shards.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import feedback, lateness, rosterfile, shards, sheets
from .lateness import LatePolicy
from .scores import _fmt


@dataclass
class Plan:
    """Which students this run grades, and how lateness counts."""

    shard: shards.Shard | None = None
    shard_origin: str = ""
    roster: list[rosterfile.Enrolled] | None = None
    policy: LatePolicy = field(default_factory=LatePolicy)
    due: datetime | None = None
    report: bool = True
    trust_claims: bool = False  # count a hand-in time the student wrote (a commit date, file times)
    everyone: list[str] = field(default_factory=list)  # every row the whole class has (all shards)
    paths: dict[str, Path] = field(default_factory=dict)  # found submission name -> its path
    owner: dict[str, str] = field(default_factory=dict)  # roster id -> found submission name
    strangers: list[str] = field(default_factory=list)  # found, on nobody's roster
    entry_of: dict[str, rosterfile.Enrolled] = field(default_factory=dict)  # found name -> roster entry

    def select(self, students: list[Any]) -> list[Any]:
        """The students (class mode's roster.Student) this run grades; remembers the whole class."""
        self.paths = {s.name: s.path for s in students}
        names = [s.name for s in students]
        if self.roster is not None:
            self.owner, self.strangers = rosterfile.match(self.roster, names)
            self.entry_of = {self.owner[e.id]: e for e in self.roster if e.id in self.owner}
            found = set(self.owner.values())
            # roster students by their id, found or not (a shard that cloned only its own students
            # does not find the others), and submissions on nobody's roster by their name
            self.everyone = [e.id for e in self.roster] + [n for n in names if n not in found]
        else:
            self.everyone = names
        if self.shard is None:
            return students
        return [s for s in students if self.mine(self.shard_key(s.name))]

    def shard_key(self, name: str) -> str:
        """A found submission's shard key: its roster entry's (:attr:`Enrolled.shard_key`), else its name."""
        entry = self.entry_of.get(name)
        return entry.shard_key if entry is not None else name

    def mine(self, key: str) -> bool:
        return self.shard is None or self.shard.holds(key)

    def settings(self) -> dict[str, Any]:
        """What of the plan changes grades: the merge refuses shards that differ in it."""
        return {"late_policy": [self.policy.per_day, self.policy.cap],
                "due": self.due.isoformat() if self.due else None, "trust_claims": self.trust_claims,
                "roster": None if self.roster is None else [
                    [e.id, e.name, list(e.keys), e.extension_days, e.due, e.submitted] for e in self.roster]}


def plan_from(*, shard: str | None, roster: Path | None, due: str | None, late_policy: str | None,
              report: bool = True, trust_claims: bool = False) -> Plan:
    """The plan a class-mode command line asks for (a SystemExit on bad input)."""
    found = (shards.parse(shard), "--shard") if shard else shards.from_env()
    plan = Plan(policy=LatePolicy.parse(late_policy), report=report, trust_claims=trust_claims,
                due=lateness.parse_time(due, "--due") if due else None,
                roster=rosterfile.read(roster) if roster is not None else None)
    if found is not None:
        plan.shard, plan.shard_origin = found
    return plan


def _late_fields(plan: Plan, row: dict[str, Any], enrolled: rosterfile.Enrolled | None) -> None:
    path = plan.paths.get(row["student"])
    own_due = enrolled.due if enrolled else None
    ext = enrolled.extension_days if enrolled else 0.0
    due = lateness.due_for(plan.due, own_due, ext)
    when, source = None, ""
    if enrolled and enrolled.submitted:
        when = lateness.parse_time(enrolled.submitted, "the roster's submitted column")
        source = lateness.FROM_ROSTER
    elif due is not None and path is not None:  # without a due date, when does not matter: no git is run
        when, source = lateness.submitted_from(path)
    late = lateness.days_late(when, due) if row["status"] != "missing" else 0
    if source in lateness.CLAIMS and not plan.trust_claims:
        # The student wrote this date: counting it would let a backdated commit make its author on
        # time while a classmate who handed in with them, and dated honestly, is late.
        late, source = 0, lateness.uncounted(source)
    top = row.get("max") or 0.0
    penalty = min(plan.policy.penalty(late, top), row["total"])
    row.update(raw=row["total"], penalty=penalty, total=round(row["total"] - penalty, 2),
               days_late=late, submitted=when.isoformat() if when else "", submitted_from=source,
               due=due.isoformat() if due else "")


def rows_for(plan: Plan, graded: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's rows of grades.csv: the graded ones, plus (with a roster) a "missing" row
    for each of this shard's students who handed in nothing; lateness applied."""
    by_name = {r["student"]: dict(r) for r in graded}
    out: list[dict[str, Any]] = []
    if plan.roster is not None:
        for e in plan.roster:
            name = plan.owner.get(e.id)
            if name is None:
                if not plan.mine(e.shard_key):
                    continue
                row = {"student": e.id, "slug": "", "status": "missing", "message": rosterfile.wants(e),
                       "total": 0.0, "max": None, "scores": {}, "seconds": 0.0}
            elif name in by_name:
                row = by_name.pop(name)
            else:
                continue  # another shard's student
            row.update(id=e.id, name=e.name)
            _late_fields(plan, row, e)
            out.append(row)
    for name in sorted(by_name):  # no roster, or found but on nobody's roster
        row = by_name[name]
        if plan.roster is not None:
            row.update(id="", name="", message=f"not on the roster; {row['message']}")
        _late_fields(plan, row, None)
        out.append(row)
    if plan.roster is None:
        out.sort(key=lambda r: r["student"])
    return out


def _blank(_: Any) -> str:
    return ""


def write_grades(rows: Sequence[dict[str, Any]], path: Path, exercises: Sequence[str], *, late: bool,
                 roster: bool) -> None:
    """grades.csv. Without a roster or a due date: student, one column per exercise, total,
    max, status, isolation, message. With them, also the roster's id and name, and ``raw`` (the
    grader's score), ``penalty`` (the late policy's) and ``final`` in place of total, and where the
    hand-in time came from (``submitted_from``: the roster's, or the student's own claim)."""
    maxes = [r["max"] for r in rows if r.get("max") is not None]
    class_max = statistics.mode(maxes) if maxes else None
    who = ["student", "id", "name"] if roster else ["student"]
    score = (["raw", "penalty", "final", "max", "days_late", "submitted", "due", "submitted_from"] if late
             else ["total", "max"])
    header = [*who, *exercises, *score, "status", "isolation", "message"]
    lines = []
    for r in rows:
        top = _fmt(r["max"] if r.get("max") is not None else class_max)
        # A row that was not graded has no points at all, rather than a zero nobody earned.
        got = _fmt if r["status"] != "not graded" else _blank
        points = ([got(r["raw"]), got(r["penalty"]), got(r["total"]), top, _fmt(r["days_late"]),
                   r["submitted"], r["due"], r.get("submitted_from", "")] if late else [got(r["total"]), top])
        lines.append([*(r.get(k, "") for k in who), *(got(r["scores"].get(e, 0.0)) for e in exercises),
                      *points, r["status"], r.get("isolation", ""), r["message"]])
    sheets.write(path, header, lines)  # names and messages are the students': no formula gets through


def write_outputs(out: Path, record: dict[str, Any], *, report: bool = True) -> None:
    """grades.csv, class-run.json and (unless ``report`` is False) the class report, from a record."""
    settings = record.get("settings", {})
    late = bool(settings.get("due")) or settings.get("roster") is not None
    write_grades(record["rows"], out / "grades.csv", record["exercises"], late=late,
                 roster=settings.get("roster") is not None)
    shards.write_record(out, record)
    if report:
        from .classreport import write_report

        write_report(out, record)


def exercise_maxima(out: Path, rows: Sequence[dict[str, Any]], exercises: Sequence[str]) -> dict[str, float]:
    """Each exercise's maximum, as this run's gradings gave it (the same for every student): what a
    merge holds every student's points to (:mod:`~grader.runners.classmode.merge`)."""
    from .scores import exercise_of, read_results

    seen: dict[str, list[float]] = {}
    for r in rows:
        if r.get("status") != "graded" or not r.get("slug"):
            continue
        for t in (read_results(out / r["slug"] / "results.json") or {}).get("tests", []):
            ex = exercise_of(str(t.get("name", "")), exercises)
            if ex is not None and isinstance(t.get("max_score"), (int, float)):
                seen.setdefault(ex, []).append(float(t["max_score"]))
    return {ex: statistics.mode(tops) for ex, tops in seen.items()}


def finish(out: Path, plan: Plan, graded: Sequence[Any], *, fingerprint: str, exercises: Sequence[str],
           extra: Sequence[str], seed: int, wall: float) -> dict[str, Any]:
    """After class mode graded ``graded`` (its Rows): every output of this run (or shard)."""
    from dataclasses import asdict

    rows = rows_for(plan, [asdict(r) for r in graded])
    feedback.write_all(out, rows)  # the students' own files: no seed, no hidden case
    if plan.report:
        from .similarity import save_functions

        for r in rows:
            if r["status"] != "missing" and r.get("slug"):
                save_functions(plan.paths.get(r["student"]), out / r["slug"], exercises)
    record = shards.run_record(fingerprint=fingerprint, exercises=exercises,
                               options=shards.public_options(extra),
                               seed=seed, shard=plan.shard, everyone=plan.everyone, rows=rows, wall=wall,
                               extra={"settings": plan.settings(), "policy": plan.policy.describe(),
                                      "maxima": exercise_maxima(out, rows, exercises)})
    write_outputs(out, record, report=plan.report)
    if plan.strangers:
        print(f"note: {len(plan.strangers)} submissions are on nobody's roster (graded, marked in "
              f"grades.csv): "
              f"{', '.join(plan.strangers[:5])}{' …' if len(plan.strangers) > 5 else ''}")
    return record


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
