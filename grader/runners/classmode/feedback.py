"""A student's feedback file, ``OUT/STUDENT/feedback.md``: the one file of a class run to hand out.

``results.json`` and ``grader.log`` are the instructor's: both name the term's seed (the log's
first line and its "reproduce with: GRADER_SEED=..."), and results.json lists every hidden
check by name with its diagnosis. This file is written from results.json and keeps only what
a student may see: the score per exercise, every public check with its feedback (the public
cases are in the student's notebook already), and for the hidden checks only how many pass --
no name, no message, no detail, nothing drawn from the seed. A line that holds the seed's
digits is left out whatever it says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FILE = "feedback.md"
#: The marks :func:`grader.report.checks_lines` starts a check's line with.
_MARKS = ("✓", "✗", "–", "!", "~")


def _checks(output: str) -> tuple[list[str], int, int, list[str]]:
    """(public check lines with their details, hidden passed, hidden counted, notes) of one test's output."""
    public: list[str] = []
    hidden_pass = hidden_all = 0
    notes: list[str] = []
    keep_detail = False
    for line in output.splitlines():
        if line.startswith(_MARKS):
            keep_detail = "(public)" in line
            if keep_detail:
                public.append(line)
            elif "(hidden)" in line and "skipped" not in line.split("(hidden)", 1)[1][:12]:
                hidden_all += 1
                hidden_pass += line.startswith("✓")
        elif line.startswith("    "):
            if keep_detail:
                public.append(line)
        elif line.startswith("note: "):
            notes.append(line)
    return public, hidden_pass, hidden_all, notes


def _num(x: Any) -> str:
    x = float(x or 0.0)
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def feedback_text(results: Mapping[str, Any], *, student: str, row: Mapping[str, Any] | None = None) -> str:
    """The Markdown a student may read (see the module); ``row``: the class row (late penalty)."""
    row = row or {}
    seed = str((results.get("extra_data") or {}).get("seed") or "")
    tests = [t for t in results.get("tests") or [] if isinstance(t, dict)]
    score, top = results.get("score", 0.0), results.get("max_score", 0.0)
    lines = [f"# Feedback for {student}", "", f"**Score: {_num(score)} / {_num(top)}**", ""]
    if float(row.get("penalty") or 0.0) > 0:
        lines += [f"Late by {_num(row.get('days_late'))} started day(s): {_num(row['penalty'])} points off, "
                  f"**final {_num(row.get('total'))} / {_num(top)}**.", ""]
    error = (results.get("extra_data") or {}).get("error")
    if error and not tests:
        lines += ["Not graded: your instructor has the reason; nothing was held against you here.", ""]
    lines += ["Hidden checks draw new cases your instructor keeps secret: their names and cases are not "
              "shown. Run the public checks (`check(fn)` in your notebook) to see what the public ones "
              "found.", ""]
    if tests:
        lines += ["| exercise | points | public checks | hidden checks pass |", "|---|---:|---|---:|"]
    details: list[str] = []
    for t in tests:
        public, hp, ha, notes = _checks(str(t.get("output") or ""))
        passed = sum(line.startswith("✓") for line in public)
        counted = sum(1 for line in public if not line.startswith(" ") and "skipped" not in line)
        name = str(t.get("name", "?")).replace("|", "/")
        lines.append(f"| {name} | {_num(t.get('score'))} / {_num(t.get('max_score'))} | "
                     f"{passed} of {counted} pass | {hp} of {ha} |")
        if public and passed < counted or notes:
            details += [f"### {name}", "", "```text", *public, *notes, "```", ""]
    if details:
        lines += ["", "## Public checks that failed", "", *details]
    kept = [line for line in lines if not seed or seed not in line]
    return "\n".join(kept).rstrip() + "\n"


def write_all(out: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``OUT/STUDENT/feedback.md`` for every row that has a folder with a results.json."""
    from .scores import read_results

    for row in rows:
        slug = row.get("slug")
        if not slug:
            continue
        results = read_results(out / slug / "results.json")
        if results is None:
            continue
        (out / slug / FILE).write_text(feedback_text(results, student=str(row.get("student", slug)), row=row),
                                       encoding="utf-8")
