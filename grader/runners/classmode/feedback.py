"""A student's feedback file, ``OUT/STUDENT/feedback.md``: the one file of a class run to hand out.

``results.json`` and ``grader.log`` are the instructor's: both name the term's seed (the log's
first line and its "reproduce with: GRADER_SEED=..."), and results.json lists every hidden
check by name with its diagnosis. This file is written from results.json and keeps only what
a student may see: the score per exercise and, for every exercise below full marks, why in
words drawn from what the student can see anyway (not found, not implemented, the load note
that names their own syntax or load error, the public checks that fail with their feedback: the
public cases are in the student's notebook already); for the hidden checks only how many pass --
no name, no message, no detail, nothing drawn from the seed. A line that holds the seed's
digits is left out whatever it says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FILE = "feedback.md"
#: The marks :func:`grader.report.checks_lines` starts a check's line with.
_MARKS = ("✓", "✗", "–", "!", "~")
#: A load note names the exercises its cell defines: "... (it defines padding_mask)".
_DEFINES = re.compile(r"\(it defines ([A-Za-z_][\w, ]*)\)")
#: Row statuses that are the submission's doing (the rest are the grader's: graded again next run).
_SUBMISSION_FAULTS = ("empty",)


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


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "/").split())


def load_notes(results: Mapping[str, Any]) -> list[str]:
    """The notes of loading the submission (a cell skipped for a syntax or load error, no
    function found): the ``note:`` lines of the report's header, about the student's own files."""
    return [line.removeprefix("note: ").strip() for line in str(results.get("output") or "").splitlines()
            if line.startswith("note: ")]


def _exercise(name: str) -> str:
    return name.split(" (chapter", 1)[0].strip()


def why(test: Mapping[str, Any], status: str, notes: Sequence[str]) -> str:
    """Why an exercise below full marks lost points, in words a student may read."""
    fn = _exercise(str(test.get("name", "?")))
    public, hp, ha, _ = _checks(str(test.get("output") or ""))
    failing = sum(1 for line in public if line.startswith("✗"))
    loaded = [n for n in notes if any(fn in m.group(1).replace(" ", "").split(",")
                                      for m in _DEFINES.finditer(n))]
    if status == "not found":
        if loaded:
            return f"its cell was skipped when your submission loaded: {loaded[0].removeprefix('skipped: ')}"
        return f"not found: your submission defines no function named `{fn}`"
    if status == "not implemented":
        return "not implemented: it still raises NotImplementedError"
    if status == "skipped":
        return "not graded: " + (str(test.get("output") or "").splitlines() or ["skipped"])[0]
    if status == "grader error":
        return ("not graded: the grader failed on its side (your instructor has the details); it is no "
                "fault of yours")
    what = {"crashed": "it raised an error", "timed out": "it ran past the time limit"}.get(status)
    if failing:
        reason = f"{failing} public check(s) fail: see below, and run `check({fn})` in your notebook"
    elif ha and hp < ha:
        reason = (f"the public checks pass, {ha - hp} of {ha} hidden checks fail: the hidden checks draw "
                  "other sizes, shapes and dtypes than the public ones; test your function on cases of "
                  "your own")
    else:
        reason = "the rules of the exercise (dtype, device, inputs unchanged): see below"
    return f"{what}; {reason}" if what else reason


def feedback_text(results: Mapping[str, Any], *, student: str, row: Mapping[str, Any] | None = None,
                  top: float | None = None) -> str:
    """The Markdown a student may read (see the module); ``row``: the class row (status, late penalty);
    ``top``: what the class is graded out of, for a submission that was not graded (no max of its own)."""
    row = row or {}
    extra = results.get("extra_data") or {}
    seed = str(extra.get("seed") or "")
    tests = [t for t in results.get("tests") or [] if isinstance(t, dict)]
    score = results.get("score", 0.0)
    top = results.get("max_score") or row.get("max") or top or 0.0
    lines = [f"# Feedback for {student}", "", f"**Score: {_num(score)} / {_num(top)}**", ""]
    if float(row.get("penalty") or 0.0) > 0:
        lines += [f"Late by {_num(row.get('days_late'))} started day(s): {_num(row['penalty'])} points off, "
                  f"**final {_num(row.get('total'))} / {_num(top)}**.", ""]
    if not tests:
        failure = str(extra.get("failure") or "")
        if row.get("status") in _SUBMISSION_FAULTS and failure:
            lines += [f"Not graded: {failure}. Hand in your exercise notebooks (`exNN_*.ipynb`) or `.py` "
                      "files.", ""]
        else:
            lines += ["Not graded: the grader could not grade this submission on your instructor's side; "
                      "your instructor has the reason, and it is graded again on the next run. Nothing was "
                      "held against you here.", ""]
    notes = load_notes(results)
    if notes:
        lines += ["## Loading your submission", "", *[f"- {_cell(n)}" for n in notes], ""]
    lines += ["Hidden checks draw new cases your instructor keeps secret: their names and cases are not "
              "shown. Run the public checks (`check(fn)` in your notebook) to see what the public ones "
              "found.", ""]
    if tests:
        lines += ["| exercise | points | public checks | hidden checks pass | why points were lost |",
                  "|---|---:|---|---:|---|"]
    status_of = extra.get("status") or {}
    details: list[str] = []
    for t in tests:
        public, hp, ha, ex_notes = _checks(str(t.get("output") or ""))
        passed = sum(line.startswith("✓") for line in public)
        counted = sum(1 for line in public if not line.startswith(" ") and "skipped" not in line)
        name = _cell(str(t.get("name", "?")))
        full = float(t.get("score") or 0) >= float(t.get("max_score") or 0)
        status = str(status_of.get(_exercise(name), t.get("status", "")))
        reason = "" if full else _cell(why(t, status, notes))
        ran = status not in ("not found", "not implemented", "grader error")
        shown = (f"{passed} of {counted} pass", f"{hp} of {ha}") if ran else ("–", "–")
        lines.append(f"| {name} | {_num(t.get('score'))} / {_num(t.get('max_score'))} | "
                     f"{shown[0]} | {shown[1]} | {reason} |")
        if public and passed < counted or ex_notes:
            details += [f"### {name}", "", "```text", *public, *ex_notes, "```", ""]
    if details:
        lines += ["", "## Public checks that failed", "", *details]
    kept = [line for line in lines if not seed or seed not in line]
    return "\n".join(kept).rstrip() + "\n"


def class_top(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """What the class is graded out of: the largest maximum of a graded row, else the course's points."""
    tops = [float(r["max"]) for r in rows if r.get("max")]
    if tops:
        return max(tops)
    from ...checks import POINTS  # every row ungraded: the course's whole

    return float(sum(POINTS.values())) or None


def write_all(out: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``OUT/STUDENT/feedback.md`` for every row that has a folder with a results.json."""
    from .scores import read_results

    top = class_top(rows)
    for row in rows:
        slug = row.get("slug")
        if not slug:
            continue
        results = read_results(out / slug / "results.json")
        if results is None:
            continue
        (out / slug / FILE).write_text(feedback_text(results, student=str(row.get("student", slug)), row=row,
                                                     top=top), encoding="utf-8")
