"""The class report: what the class got wrong, in one page.

After a class run (or a merge of shards) :func:`write_report` writes
``class-report.html`` (self-contained: the figures are PNGs embedded as base64, so it
opens from ``file://`` and can be mailed) and ``class-report.md`` into OUT. Per
exercise it shows the score distribution, the classic mistakes the grader's
diagnoses named (:data:`grader.mistakes.MISTAKES` and each chapter's own), with how
many students made each and one anonymised example of the mask grid the grader
printed, the checks that failed most, and how long grading took; then the
similarity flags (:mod:`.similarity`).

Everything is read back from OUT: ``class-run.json`` and each student's
``results.json`` and ``functions.json``, so a merged class is reported like one run.
"""

from __future__ import annotations

import ast
import base64
import html
import io
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import lateness, similarity
from .scores import exercise_of, read_results

_GRADER = Path(__file__).resolve().parents[2]
OTHER = "other (no classic mistake named)"
#: An exercise the grader did not find in the submission (not handed in, or a notebook it could not read).
NOT_FOUND = "not found"


@lru_cache(maxsize=1)
def classic_mistakes() -> dict[str, str]:
    """Every classic mistake's message -> its name, read from the grader's sources (no torch import)."""
    found: dict[str, str] = {}
    for f in [_GRADER / "mistakes.py", *sorted((_GRADER / "checks").glob("*.py"))]:
        for node in ast.parse(f.read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id.startswith("MISTAKES") and node.value is not None:
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                found.update({msg: key for key, msg in value.items() if isinstance(msg, str)})
    return found


def name_mistake(text: str) -> str:
    """The classic mistake a line of feedback names (the longest message it quotes), else OTHER."""
    hits = [(len(msg), key) for msg, key in classic_mistakes().items() if msg in text]
    return max(hits)[1] if hits else OTHER


@dataclass
class ExerciseStats:
    name: str
    max_score: float = 0.0
    shares: list[float] = field(default_factory=list)  # score / max, one per graded student
    mistakes: Counter = field(default_factory=Counter)  # mistake -> students
    example: dict[str, str] = field(default_factory=dict)  # mistake -> one anonymised grid
    failed_checks: Counter = field(default_factory=Counter)  # check name -> students


def _grid(output: str) -> str:
    """The first expected/got/wrong-cells grid of a test's output, without anything else."""
    lines = output.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip().startswith("rows = ") or ": rows = " in ln:
            block = [ln]
            for nxt in lines[i + 1:]:
                if not nxt.startswith("    ") or nxt.lstrip().startswith(("✗", "✓", "–")):
                    break
                block.append(nxt)
            indent = min(len(b) - len(b.lstrip()) for b in block)
            return "\n".join(b[indent:] for b in block)
    return ""


def _check_name(line: str) -> str:
    body = line.lstrip("✗ ").split(": ", 1)[0]
    for tag in (" (public)", " (hidden)"):
        body = body.replace(tag, "")
    return body


def gather(out: Path, record: dict[str, Any]) -> dict[str, ExerciseStats]:
    exercises = record["exercises"]
    stats = {e: ExerciseStats(e) for e in exercises}
    for row in record["rows"]:
        if not row.get("slug") or row["status"] != "graded":
            continue
        results = read_results(out / row["slug"] / "results.json")
        status = (results or {}).get("extra_data", {}).get("status") or {}
        for t in (results or {}).get("tests", []):
            ex = exercise_of(str(t.get("name", "")), exercises)
            if ex is None or not t.get("max_score"):
                continue
            s, text = stats[ex], str(t.get("output", ""))
            s.max_score = max(s.max_score, float(t["max_score"]))
            s.shares.append(float(t.get("score", 0) or 0) / float(t["max_score"]))
            if float(t.get("score", 0) or 0) >= float(t["max_score"]):
                continue
            headline = text.splitlines()[0] if text else ""
            unwritten = "not implemented" in headline.lower()
            if isinstance(status, dict) and status.get(ex) == NOT_FOUND:
                mistake = NOT_FOUND
            else:
                mistake = "not implemented" if unwritten else name_mistake(headline)
            s.mistakes[mistake] += 1
            if mistake not in s.example and (grid := _grid(text)):
                s.example[mistake] = grid
            for name in {_check_name(ln) for ln in text.splitlines() if ln.startswith("✗ ")}:
                s.failed_checks[name] += 1
    return {e: s for e, s in stats.items() if s.shares}  # the exercises this run graded


# --------------------------------------------------------------------------- figures


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _figures(stats: dict[str, ExerciseStats], n: int) -> tuple[str, str, dict[str, str]]:
    """The overview (mean score per exercise), the top mistakes, one histogram per exercise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(stats)
    means = [100 * statistics.fmean(s.shares) if s.shares else 0.0 for s in stats.values()]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1))
    ax.barh(names[::-1], means[::-1], color="#4c72b0")
    ax.set_xlim(0, 100)
    ax.set_xlabel("mean score (% of the exercise's points)")
    ax.set_title(f"Mean score per exercise ({n} students)")
    overview = _png(fig)
    top = sorted(((c, f"{e}: {m}") for e, s in stats.items() for m, c in s.mistakes.items()
                  if m not in (OTHER, "not implemented", NOT_FOUND)), reverse=True)[:12]
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(1, len(top)) + 1))
    ax.barh([t[1] for t in top][::-1], [100 * t[0] / max(1, n) for t in top][::-1], color="#c44e52")
    ax.set_xlim(0, 100)
    ax.set_xlabel("students who made it (% of the class)")
    ax.set_title("The classic mistakes the class made most")
    mistakes = _png(fig)
    hists = {}
    for e, s in stats.items():
        fig, ax = plt.subplots(figsize=(3.2, 2.0))
        ax.hist([100 * x for x in s.shares], bins=[*range(0, 100, 10), 100.01], color="#55a868")
        ax.set_xlabel("score (%)")
        ax.set_ylabel("students")
        ax.set_title(e, fontsize=9)
        hists[e] = _png(fig)
    return overview, mistakes, hists


# --------------------------------------------------------------------------- the page


def _timing(record: dict[str, Any]) -> str:
    secs = [float(r.get("seconds") or 0) for r in record["rows"] if r.get("seconds")]
    parts = [f"{len(record['rows'])} students"]
    if secs:
        parts.append(f"{statistics.median(secs):.2f} s per student (median of {len(secs)} gradings), "
                     f"{max(secs):.1f} s the longest")
    parts.append(f"{float(record.get('wall_seconds') or 0):.1f} s wall"
                 + (f" (the slowest of {len(record['shards'])} shards)" if record.get("shards") else ""))
    return "; ".join(parts)


def _status_line(record: dict[str, Any]) -> str:
    counts = Counter(r["status"] for r in record["rows"])
    line = ", ".join(f"{c} {s}" for s, c in counts.most_common())
    claims = [r for r in record["rows"] if lateness.is_claim(r.get("submitted_from"))]
    if claims:  # a due date without the platform's times: the class's hand-in times are the students' word
        counted = sum(1 for r in claims if r.get("submitted_from") in lateness.CLAIMS)
        line += (f"; {len(claims)} hand-in times are the student's own claim (a commit date or file times, "
                 "set on their machine), not the platform's: give the roster a submitted column"
                 + (f" ({counted} counted: --trust-student-dates)" if counted else
                    " (not counted for lateness: --trust-student-dates counts them)"))
    return line


def markdown(record: dict[str, Any], stats: dict[str, ExerciseStats],
             flags: Sequence[similarity.Flag]) -> str:
    n = sum(1 for r in record["rows"] if r["status"] == "graded")
    lines = ["# Class report", "", f"Students: {_status_line(record)}. Grading: {_timing(record)}.",
             "", record.get("policy", ""), ""]
    lines += ["## The classic mistakes the class made most", "", "| exercise | mistake | students | share |",
              "|---|---|---|---|"]
    top = sorted(((c, e, m) for e, s in stats.items() for m, c in s.mistakes.items()
                  if m not in (OTHER, "not implemented", NOT_FOUND)), reverse=True)
    lines += ([f"| {e} | {m} | {c} | {100 * c / max(1, n):.0f}% |" for c, e, m in top[:15]]
              or ["| – | none | | |"])
    for e, s in stats.items():
        mean = f"{100 * statistics.fmean(s.shares):.0f}%" if s.shares else "–"
        full = sum(1 for x in s.shares if x >= 1)
        lines += ["", f"## {e}", "", f"Mean score {mean}; {full} of {len(s.shares)} students have full "
                  "marks.",
                  ""]
        if s.mistakes:
            lines += ["| mistake | students |", "|---|---|"]
            lines += [f"| {m} | {c} |" for m, c in s.mistakes.most_common()]
        if s.failed_checks:
            lines += ["", "Checks that failed most: " + "; ".join(f"{k} ({c})" for k, c in
                                                                   s.failed_checks.most_common(5))]
        for m, grid in list(s.example.items())[:1]:
            lines += ["", f"One anonymised example ({m}):", "", "```", grid, "```"]
    lines += ["", "## Similarity flags", "", similarity.NOTE, ""]
    lines += ([f"- {f.exercise}: {f.a} and {f.b}, similarity {f.score:.2f}"
               + (f" (also alike: {', '.join(f.others)})" if f.others else "") for f in flags]
              or ["No pair is flagged."])
    return "\n".join(lines) + "\n"


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
pre{background:#f6f6f6;padding:.5em;line-height:1.15}.ex{display:flex;gap:1.5em;align-items:flex-start;
border-top:1px solid #ddd;padding-top:.5em}.ex>div{flex:1;min-width:0}
.pair{display:flex;gap:1em}.pair pre{flex:1;
overflow:auto;font-size:12px}.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}"""


def page(record: dict[str, Any], stats: dict[str, ExerciseStats], flags: Sequence[similarity.Flag]) -> str:
    n = sum(1 for r in record["rows"] if r["status"] == "graded")
    overview, top, hists = _figures(stats, n)
    esc = html.escape
    meaning = {key: msg for msg, key in classic_mistakes().items()}
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Class report</title>"
           f"<style>{CSS}</style></head><body><h1>Class report</h1>",
           f"<p>Students: {esc(_status_line(record))}. Grading: {esc(_timing(record))}.</p>",
           f"<p>{esc(record.get('policy', ''))}</p>",
           f"<img alt='the classic mistakes the class made most' src='data:image/png;base64,{top}'>",
           f"<img alt='mean score per exercise' src='data:image/png;base64,{overview}'>"]
    for e, s in stats.items():
        mean = f"{100 * statistics.fmean(s.shares):.0f}%" if s.shares else "–"
        rows = "".join(f"<tr><td>{esc(m)}</td><td>{c}</td><td>{100 * c / max(1, n):.0f}%</td>"
                       f"<td>{esc(meaning.get(m, ''))}</td></tr>" for m, c in s.mistakes.most_common())
        checks = "".join(f"<li>{esc(k)} ({c})</li>" for k, c in s.failed_checks.most_common(5))
        example = next(iter(s.example.items()), None)
        out.append(f"<section class='ex' id='{esc(e)}'><img alt='score distribution of {esc(e)}' "
                   f"src='data:image/png;base64,{hists[e]}'><div><h2>{esc(e)}</h2><p>mean score {mean}</p>"
                   + ("<table class='mistakes'><tr><th>mistake</th><th>students</th><th>share</th>"
                      "<th>what it is</th></tr>"
                      f"{rows}</table>"
                      if rows else "<p>No student lost points here.</p>")
                   + (f"<p>Checks that failed most:</p><ul>{checks}</ul>" if checks else "")
                   + (f"<p>One anonymised example ({esc(example[0])}):</p><pre>{esc(example[1])}</pre>"
                      if example else "") + "</div></section>")
    out.append(f"<h2>Similarity flags</h2><p class='note'>{esc(similarity.NOTE)}</p>")
    if not flags:
        out.append("<p>No pair is flagged.</p>")
    for f in flags:
        also = f" (also alike: {esc(', '.join(f.others))})" if f.others else ""
        # What students wrote, never the reference: the report is mailed; solutions/ is not.
        other = REFERENCE_NOT_SHOWN if f.b.startswith("reference:") else f.b_source
        out.append(f"<div class='flag'><h3>{esc(f.exercise)}: {esc(f.a)} and {esc(f.b)} "
                   f"(similarity {f.score:.2f}){also}</h3><div class='pair'><pre>{esc(f.a_source)}</pre>"
                   f"<pre>{esc(other)}</pre></div></div>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(out: Path, record: dict[str, Any]) -> tuple[Path, Path]:
    """OUT/class-report.html and OUT/class-report.md for the class run ``record``."""
    stats = gather(out, record)
    graded = [e for e in record["exercises"] if e in stats]
    flags = similarity.grouped(similarity.flags(similarity.load_students(out, record["rows"]), graded))
    md, page_html = out / "class-report.md", out / "class-report.html"
    _write_private(md, markdown(record, stats, flags))
    _write_private(page_html, page(record, stats, flags))
    return page_html, md


#: What the report shows where a student's function is flagged against the reference.
REFERENCE_NOT_SHOWN = "(the reference is not shown here: compare with solutions/ in the course's repository)"


def _write_private(path: Path, text: str) -> None:
    """``path`` written 0600 whatever the umask, as the other files of a class run that hold
    what students must not read (their code, the seed): the report shows students' code."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.fchmod(fd, 0o600)  # an earlier report may be 0644
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
