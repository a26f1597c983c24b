"""A :class:`~grader.results.Report` as text: terminal, Gradescope JSON, JUnit XML, Markdown.

Every format says the seed and whether hidden checks ran, and none contains a
timing except Gradescope's top-level ``execution_time``: the same submission
graded twice with the same seed gives the same files. Where the time went is the
instructor's, in a file of its own (:func:`write_timing`).
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from typing import Any

from . import timing
from .results import (
    CRASHED,
    GRADER_ERROR,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    NOT_IMPLEMENTED_MESSAGE,
    PARTIAL,
    PASSED,
    SKIPPED,
    TIMED_OUT,
    ExerciseResult,
    Report,
    protected,
)

MARK = {"passed": "✓", "failed": "✗", "skipped": "–"}
_STYLE = {PASSED: "green", PARTIAL: "yellow", SKIPPED: "dim", NOT_FOUND: "red", NOT_IMPLEMENTED: "red",
          CRASHED: "red", TIMED_OUT: "red", GRADER_ERROR: "magenta"}
# Statuses whose one message says it all: listing every check would only repeat it.
_NOTHING_RAN = (NOT_FOUND, NOT_IMPLEMENTED, GRADER_ERROR)


def fmt_points(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"


def test_name(e: ExerciseResult) -> str:
    """The name of an exercise's entry in every format: contains the function name."""
    return f"{e.name} (chapter {e.chapter})"


def seed_line(r: Report) -> str:
    return f"seed {r.seed} ({r.checks_kind})"


def reproduce(r: Report) -> str:
    """The command that reproduces this grading (for staff: it holds the seed)."""
    flags = " --public-only" if r.public_only else ""
    return f"GRADER_SEED={r.seed} python -m grader {r.submission}{flags}"


def check_yourself(r: Report) -> str:
    """What a student can run to check their work again (without the instructor's seed): on the
    file they handed in, when it was one (a platform puts an upload in a folder of its own, such
    as Gradescope's ``submission/``, which the student does not have), else on their folder."""
    path = os.path.normpath(r.submission)
    if os.path.isdir(path):
        try:
            handed = sorted(f for f in os.listdir(path)
                            if f.endswith((".ipynb", ".py")) and not f.startswith("."))
        except OSError:
            handed = []
        if len(handed) == 1:
            return f"python -m grader {handed[0]}"
        if handed:
            return "python -m grader FOLDER (the folder of your notebooks, e.g. exercises/)"
    return f"python -m grader {os.path.basename(path) or r.submission}"


def summary_line(e: ExerciseResult) -> str:
    """One line: how the exercise went."""
    counted = [c for c in e.checks if not c.skipped]
    passed = sum(c.passed for c in counted)
    if e.status == PASSED:
        return f"passed: all {len(counted)} checks pass"
    if e.status in _NOTHING_RAN:
        return e.message
    if e.status in (CRASHED, TIMED_OUT):
        return f"{e.status}: {e.message} ({passed} of {len(counted)} checks pass)"
    if e.status == SKIPPED:
        return f"skipped: {e.message}"
    return f"{passed} of {len(counted)} checks pass; first failing: {e.message}"


def checks_lines(e: ExerciseResult, *, indent: str = "    ") -> list[str]:
    """One line per check (mark, name, public/hidden, message), details of failures indented."""
    lines = []
    for c in e.checks:
        kind = "public" if c.public else "hidden"
        text = f"{MARK[c.status]} {c.name} ({kind})"
        if c.skipped:
            text += f": skipped, {c.message}"
        elif not c.passed and c.message:
            text += f": {c.message}"
        lines.append(text)
        if not c.passed and not c.skipped and c.detail:
            lines.extend(indent + d for d in c.detail.splitlines())
    return lines


def exercise_text(e: ExerciseResult, *, checks: bool = True) -> str:
    """Plain-text feedback for one exercise: the summary, each check, its details, the notes."""
    lines = [summary_line(e)]
    if checks and e.status not in _NOTHING_RAN:
        lines += checks_lines(e)
    lines.extend(f"note: {n}" for n in e.notes)
    return "\n".join(lines)


def header_text(r: Report) -> str:
    lines = [f"Score {fmt_points(r.score)} / {fmt_points(r.max_score)} · {seed_line(r)}"]
    if r.error:
        lines.append(f"Not graded: {r.error}")
    if not r.public_only:
        lines.append("Hidden checks draw new cases from your instructor's seed. Check your work with the "
                     f"public checks (check(fn) in the notebook) or the whole grader: {check_yourself(r)}")
    lines.extend(f"note: {n}" for n in r.notes)
    if r.output and r.public_only:
        lines += ["", "What your code printed (truncated):", r.output]
    elif r.output:  # it may have printed a hidden case's inputs, in any spelling
        lines += ["", "What your code printed is not shown: hidden cases were run. Print in your notebook, "
                      f"or run the public checks ({check_yourself(r)} --public-only), to see it."]
    return "\n".join(lines)


# --------------------------------------------------------------------------- Gradescope


def gradescope(r: Report) -> dict[str, Any]:
    """Gradescope's results.json: one test per exercise, its name containing the function name."""
    tests = []
    for e in r.exercises:
        tests.append({
            "name": test_name(e),
            "score": e.score,
            "max_score": e.max_score,
            "status": "passed" if e.score >= e.max_score else "failed",
            "output": exercise_text(e),
            "visibility": "visible",
        })
    return {
        "score": r.score,
        "max_score": r.max_score,
        "output": header_text(r),
        "output_format": "text",
        "test_output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "execution_time": round(r.execution_time, 2),
        "tests": tests,
        "extra_data": {"seed": r.seed, "public_only": r.public_only, "error": r.error,
                       "isolation": dict(r.isolation),
                       "status": {e.name: e.status for e in r.exercises}},
    }


def unprotected(r: Report) -> str:
    """"the seed and the reference answers", "the seed", ... : what student code could read."""
    what = [name for key, name in (("seed_protected", "the seed"), ("references_protected",
                                                                    "the reference answers"))
            if not r.isolation.get(key, True)]
    return " and ".join(what)


def write_json(r: Report, path: str | os.PathLike) -> None:
    _write(path, json.dumps(gradescope(r), indent=2, ensure_ascii=False) + "\n")


def write_timing(r: Report, path: str | os.PathLike) -> None:
    """Where the grading's time went, per exercise and phase (:mod:`grader.timing`): the
    instructor's, written only where asked (``--timing``), never into what a student sees."""
    _write(path, json.dumps(timing.of_report(r), indent=2) + "\n")


def failure_json(message: str, path: str | os.PathLike) -> None:
    """A valid results.json when grading could not even start (bad command line)."""
    data = {"score": 0.0, "max_score": 0.0, "output": message, "visibility": "visible",
            "execution_time": 0.0, "tests": [], "extra_data": {"error": message}}
    _write(path, json.dumps(data, indent=2) + "\n")


def _write(path: str | os.PathLike, text: str) -> None:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- JUnit


def junit(r: Report) -> str:
    """JUnit XML: a suite per exercise, a test case per check (CI shows each property)."""
    suites = ET.Element("testsuites", name="grader")
    props_all = {"seed": str(r.seed), "checks": r.checks_kind, "score": fmt_points(r.score),
                 "max_score": fmt_points(r.max_score)}
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for e in r.exercises:
        suite = ET.SubElement(suites, "testsuite", name=e.name)
        props = ET.SubElement(suite, "properties")
        for k, v in {**props_all, "exercise_score": fmt_points(e.score),
                     "exercise_max_score": fmt_points(e.max_score), "status": e.status}.items():
            ET.SubElement(props, "property", name=k, value=v)
        cases = e.checks or []
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        classname = f"grader.chapter{e.chapter}.{e.name}"
        if not cases:
            case = ET.SubElement(suite, "testcase", classname=classname, name=e.name)
            ET.SubElement(case, "failure", message=e.message).text = exercise_text(e)
            counts["tests"] += 1
            counts["failures"] += 1
        for c in cases:
            case = ET.SubElement(suite, "testcase", classname=classname,
                                 name=f"{c.name} ({'public' if c.public else 'hidden'})")
            counts["tests"] += 1
            if c.skipped:
                ET.SubElement(case, "skipped", message=c.message)
                counts["skipped"] += 1
            elif not c.passed:
                message = e.message if e.status in _NOTHING_RAN else c.message
                ET.SubElement(case, "failure", message=message).text = c.detail or message
                counts["failures"] += 1
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        suites.set(k, str(v))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_junit(r: Report, path: str | os.PathLike) -> None:
    _write(path, junit(r))


# --------------------------------------------------------------------------- Markdown


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def markdown(r: Report) -> str:
    """A summary for a CI job page (e.g. $GITHUB_STEP_SUMMARY)."""
    icon = {PASSED: "✅", PARTIAL: "🟡", SKIPPED: "⚪"}
    lines = [f"## Grader: {fmt_points(r.score)} / {fmt_points(r.max_score)}", "",
             f"Graded with {seed_line(r)}.", ""]
    if r.error:
        lines += [f"**Not graded:** {_md(r.error)}", ""]
    lines += ["| exercise | score | status | first failing property |", "|---|---:|---|---|"]
    for e in r.exercises:
        first = "" if e.status == PASSED else _md(e.message)
        lines.append(f"| `{e.name}` | {fmt_points(e.score)} / {fmt_points(e.max_score)} | "
                     f"{icon.get(e.status, '❌')} {e.status} | {first} |")
    failing = [e for e in r.exercises if e.status != PASSED]
    if failing:
        lines += ["", "### Feedback", ""]
        for e in failing:
            lines += [f"<details><summary><code>{e.name}</code>: {_md(e.status)}</summary>", "", "```text",
                      exercise_text(e).replace("```", "'''"), "```", "", "</details>", ""]
    if r.notes:
        lines += ["", "### Notes", ""] + [f"- {_md(n)}" for n in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(r: Report, path: str | os.PathLike) -> None:
    """Writes ``path``; appends when it is $GITHUB_STEP_SUMMARY (which collects every step's summary)."""
    path = os.fspath(path)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and os.path.abspath(path) == os.path.abspath(summary):
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown(r))
    else:
        _write(path, markdown(r))


# --------------------------------------------------------------------------- terminal


def _nothing_found(r: Report) -> bool:
    """No exercise of the submission was found, all for the same reason (an empty notebook)."""
    return bool(r.exercises) and not r.error and all(e.status == NOT_FOUND for e in r.exercises)


def _print_nothing_found(r: Report, console) -> None:
    """The table of a submission in which no exercise was found: one line for all of them."""
    from rich.text import Text

    reasons = {e.message.removeprefix("not found: ") for e in r.exercises}
    why = reasons.pop() if len(reasons) == 1 else ""  # else each exercise's, "no function named X"
    n = len(r.exercises)
    which = f"all {n} exercises graded here not found" if n > 1 else f"{r.exercises[0].name} not found"
    console.print(Text(f"Grader: {r.submission} · {seed_line(r)}", style="bold"), highlight=False)
    console.print(Text(f"total {fmt_points(r.score)} / {fmt_points(r.max_score)}: {which}"
                       + (f": {why}" if why else ""), style="bold red"), highlight=False)


def print_terminal(r: Report, console=None, *, verbose: bool = False, scope: str = "",
                   course_max: float | None = None) -> None:
    """A rich table (exercise, score, status, first failing property), then feedback on failures.

    By default short (:mod:`grader.terminal`): one row per exercise, one diagnosis per failing
    exercise, and the notebook to open next; ``verbose`` lists every check. ``scope`` names what
    was graded when it is not the whole course ("chapter 1"), and ``course_max`` is then the
    course's total, for a course total labelled so.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import terminal

    console = console or Console()
    r = terminal.printable_report(r)  # nothing a submission wrote may drive the terminal
    if terminal.nothing_graded(r):  # no table of zeros, no total, no exercise "next": only why
        console.print(Text(f"Grader: {r.submission} · nothing was graded", style="bold"), highlight=False)
        console.print(Text(f"Not graded: {r.error}", style="bold red"))
        console.print(Text(terminal.next_step(r), style="bold"), highlight=False)
        return
    compact = not verbose and _nothing_found(r)  # one line for all the exercises, not one each
    total = "total" + (f" ({scope})" if scope else "")
    rows = [(f"{terminal.number(e)} {e.name}", f"{fmt_points(e.score)} / {fmt_points(e.max_score)}",
             e.status, "" if e.status == PASSED or e.message == NOT_IMPLEMENTED_MESSAGE else e.message)
            for e in r.exercises]
    rows.append((total, f"{fmt_points(r.score)} / {fmt_points(r.max_score)}", "", ""))
    if compact:
        _print_nothing_found(r, console)
    elif verbose:
        table = Table(title=Text(f"Grader: {r.submission}"), caption=Text(seed_line(r)))
        for i, header in enumerate(("exercise", "score", "status")):
            table.add_column(header, justify="right" if i == 1 else "left", no_wrap=True)
        table.add_column("first failing property", overflow="fold")
        for i, (name, points, status, message) in enumerate(rows):
            if i == len(rows) - 1:
                table.add_section()
                table.add_row(Text(name, style="bold"), Text(points, style="bold"), Text(""), Text(""))
            else:
                table.add_row(Text(name), Text(points), Text(status, style=_STYLE.get(status, "red")),
                              Text(message))
        console.print(table)
    else:  # one line per row, whatever the width: the diagnosis below says it in full
        console.print(Text(f"Grader: {r.submission} · {seed_line(r)}", style="bold"), highlight=False)
        # A terminal's width cuts the message column; a file or a pipe (a log, `| less`) gets it whole.
        lines = terminal.table_lines(rows, console.width if console.is_terminal else None)
        for k, cells in enumerate(lines):
            plain = k in (0, len(lines) - 1)  # the header and the total
            console.print(Text.assemble(*((cell, "bold" if plain else _STYLE.get(cell.strip(), "") if j == 2
                                           else "") for j, cell in enumerate(cells))), highlight=False,
                          soft_wrap=not console.is_terminal)
    if scope and course_max:
        console.print(Text(f"course total: {fmt_points(r.score)} / {fmt_points(course_max)} "
                           f"(only {scope} graded here)"), highlight=False)
    if r.error:
        console.print(Text(f"Not graded: {r.error}", style="bold red"))
    for e in r.exercises:
        if (e.status == PASSED or e.status in _NOTHING_RAN) and not e.notes or compact:
            continue  # the table said it all
        console.print(Text(f"\n{terminal.number(e)} {e.name}", style="bold " + _STYLE.get(e.status, "red")))
        if verbose:
            console.print(Text(exercise_text(e, checks=e.status != PASSED)), highlight=False)
            continue
        lines = terminal.diagnosis(e) if e.status in terminal.DIAGNOSED else []
        console.print(Text("\n".join(lines + [f"note: {n}" for n in e.notes])), highlight=False)
    skipped: dict[str, int] = {}
    for e in r.exercises if not compact else []:  # nothing ran, so nothing was skipped
        for c in e.skipped_checks:
            skipped[c.message] = skipped.get(c.message, 0) + 1
    for why, n in skipped.items():
        console.print(Text(f"\n– {n} check(s) skipped, not counted: {why}", style="dim"), highlight=False)
    notes = [n for n in r.notes if not (compact and n in r.exercises[0].message)]
    if notes:
        console.print(Text("\nnotes", style="bold"))
        for n in notes:
            console.print(Text(f"- {n}"), highlight=False)
    if r.output:
        console.print(Text("\nwhat your code printed (truncated)", style="bold"))
        output = r.output.splitlines()
        shown = output if verbose else output[-terminal.DETAIL_LINES:]
        if len(shown) < len(output):
            shown = [f"... ({len(output) - len(shown)} earlier lines with --verbose)"] + shown
        console.print(Text("\n".join(shown)), highlight=False)
    if not r.public_only and r.isolation and not protected(r.isolation):
        console.print(Text(f"\nwarning: not protected from student code: {unprotected(r)}. "
                           f"{r.isolation.get('why', '')}", style="yellow"), highlight=False)
    tail = "public checks only: the full grader runs hidden cases too" if r.public_only else (
        f"hidden cases drawn with seed {r.seed}; reproduce with: {reproduce(r)}")
    if not compact:
        console.print(Text(f"\n{tail}" if verbose else tail, style="dim"), highlight=False)
    console.print(Text(terminal.next_step(r), style="bold"), highlight=False)
