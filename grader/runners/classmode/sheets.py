"""Cells for spreadsheets: every CSV the grader writes for people (grades.csv, the exports).

A student names their own folder, notebook and functions, and those names land in cells.
Spreadsheet programs run a cell that begins with ``=``, ``+``, ``-`` or ``@`` as a formula
(``=HYPERLINK(...)`` leaks data when clicked; older ones run commands), and treat a leading
tab or carriage return as a way round the first check. OWASP's rule for CSV injection is
applied to every text cell: such a cell gets a leading ``'``, which spreadsheets show as
text. Numbers are left alone (``-0.5`` stays a number); the ``csv`` module quotes what
needs quoting (OWASP's other half: separators and quotes inside a cell).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: What a cell may not begin with (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def cell(value: Any) -> str:
    """``value`` as a cell that no spreadsheet takes for a formula."""
    text = "" if value is None else str(value)
    if text.startswith(FORMULA_STARTS) and not _is_number(text):
        return "'" + text
    return text


def write(path: Path, header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> None:
    """A CSV file of ``header`` and ``rows``, every cell through :func:`cell`."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([cell(v) for v in header])
        w.writerows([cell(v) for v in row] for row in rows)
