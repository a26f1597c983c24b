"""The short terminal report's parts: exercise numbers, one diagnosis per exercise, what to fix next.

A partly finished folder used to print every failing check with its mask grid:
the same diagnosis up to ten times per exercise, the summary scrolled away.
By default :func:`grader.report.print_terminal` now shows one row per exercise,
then for each failing exercise its first diagnosis once, with how many failing
checks it explains and the first one's detail (the mask-grid diff), and ends
with the notebook to open next. ``--verbose`` lists every check as before.
Plain text from :mod:`grader.results` only; :mod:`grader.report` lays it out.
"""

from __future__ import annotations

import re
from pathlib import Path

from .results import CRASHED, FAILED, PARTIAL, PASSED, SKIPPED, TIMED_OUT, CheckResult, ExerciseResult, Report
from .safetext import map_strings

#: Statuses that get a diagnosis under the table (the others say it all in their row).
DIAGNOSED = (PARTIAL, FAILED, CRASHED, TIMED_OUT)
#: Lines of a check's detail shown in the short report (a mask grid of L = 8 fits).
DETAIL_LINES = 12
COURSE_EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
_CHAPTER = re.compile(r"^ex(\d+)_")
# Escape sequences (CSI, OSC, DCS..., two-byte ESC x), then every other C0/C1 control but \n and \t,
# and the bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)|\x1b[@-_]?"
                      r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", re.S)


#: Set in a notebook's kernel, and so in a ``!python -m grader`` it runs: IPython runs that command
#: on a pseudo-terminal, which looks like a terminal but shows every frame of a progress bar.
NOTEBOOK_ENV = ("JPY_PARENT_PID", "JPY_SESSION_NAME", "COLAB_RELEASE_TAG", "VSCODE_PID_NOTEBOOK")


def live_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal a person watches redraw: a tty, no
    notebook cell behind it (:data:`NOTEBOOK_ENV`, or matplotlib's inline backend), not TERM=dumb.
    Progress bars are drawn only there; FORCE_COLOR does not make a pipe one."""
    import os
    import sys

    stream = sys.stderr if stream is None else stream
    try:
        tty = os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    env = os.environ
    in_notebook = any(env.get(k) for k in NOTEBOOK_ENV) or "matplotlib_inline" in env.get("MPLBACKEND", "")
    return tty and not in_notebook and env.get("TERM", "") != "dumb"


def printable(text: str) -> str:
    """``text`` with no terminal control characters: no ANSI escapes, no carriage returns,
    no other C0/C1 controls but newlines and tabs. Student code's output, its error messages
    and even its file names reach the report: none of it may clear the screen or draw a total."""
    return _CONTROL.sub("", text)


def printable_report(r: Report) -> Report:
    """A copy of ``r`` with every string in it :func:`printable` (what the terminal shows)."""
    return map_strings(r, printable)


def number(e: ExerciseResult) -> str:
    """"3.1": the chapter and the exercise's place in it, as the notebooks' headings number them."""
    from .checks import EXERCISES

    same = [name for name, ex in EXERCISES.items() if int(ex.chapter) == e.chapter]
    return f"{e.chapter}.{same.index(e.name) + 1}" if e.name in same else str(e.chapter)


def notebook_of(chapter: int, submission: str) -> str | None:
    """The notebook that holds ``chapter``'s exercises: in the submission's folder, else the course's."""
    sub = Path(submission)
    if sub.is_file():
        return sub.name
    for folder in (sub, COURSE_EXERCISES):
        if folder.is_dir():
            for f in sorted(folder.glob("ex*.ipynb")):
                m = _CHAPTER.match(f.name)
                if m and int(m.group(1)) == chapter:
                    return f.name
    return None


def nothing_graded(r: Report) -> bool:
    """The grading stopped before any student code ran (no sandbox, a submission not read)."""
    from .results import GRADER_ERROR

    return bool(r.error) and r.internal_error and all(e.status == GRADER_ERROR for e in r.exercises)


def next_step(r: Report) -> str:
    """The last line: the first exercise, in chapter order, that does not pass yet, and where it is."""
    todo = next((e for e in sorted(r.exercises, key=lambda e: e.chapter)
                 if e.status not in (PASSED, SKIPPED)), None)
    if r.error and (todo is None or nothing_graded(r)):
        return "next: fix what stopped the grading (above), then grade again"
    if todo is None:
        return "next: nothing to fix: every exercise graded here passes"
    where = notebook_of(todo.chapter, r.submission)
    return f"next: exercise {number(todo)} {todo.name}" + (f" in {where}" if where else "")


def table_lines(rows: list[tuple[str, str, str, str]], width: int | None) -> list[list[str]]:
    """The short table: a header, one line per row (the last row is the total), cells padded.

    Each line fits in ``width``: the message column is cut with "…" (the diagnosis says it in full).
    ``width=None`` (output to a file or a pipe, where nothing wraps) cuts nothing.
    """
    rows = [("exercise", "score", "status", "first failing property"), *rows]
    w = [max(len(row[i]) for row in rows) for i in range(3)]
    room = max(12, width - sum(w) - 8) if width is not None else max(len(row[3]) for row in rows)
    out = []
    for name, points, status, message in rows:
        cut = message if len(message) <= room else message[:room - 1] + "…"
        out.append([f"  {name:<{w[0]}}  ", f"{points:>{w[1]}}", f"  {status:<{w[2]}}", f"  {cut}".rstrip()])
    return out


def explained(e: ExerciseResult) -> tuple[CheckResult | None, int, int]:
    """The first failing check, how many failing checks say the same thing, and how many fail."""
    failing = [c for c in e.checks if not c.passed and not c.skipped]
    if not failing:
        return None, 0, 0
    first = failing[0]
    return first, sum(c.message == first.message for c in failing), len(failing)


def diagnosis(e: ExerciseResult, indent: str = "    ") -> list[str]:
    """A failing exercise's first diagnosis, once: the check, its message, its detail, the count."""
    first, same, failing = explained(e)
    if first is None:
        return [e.message] if e.message else []
    kind = "public" if first.public else "hidden"
    lines = [f"✗ {first.name} ({kind}): {first.message or e.message}"]
    detail = first.detail.splitlines()
    lines += [indent + d for d in detail[:DETAIL_LINES]]
    if len(detail) > DETAIL_LINES:
        lines.append(f"{indent}... ({len(detail) - DETAIL_LINES} more lines with --verbose)")
    if failing > 1:
        others = failing - same
        said = f"all {failing}" if same == failing else f"{same} of the {failing}"
        text = f"the same diagnosis explains {said} failing checks" if same > 1 else f"{failing} checks fail"
        if others:
            text += f"; --verbose lists the {others} other{'s' if others > 1 else ''}"
        lines.append(text)
    return lines
