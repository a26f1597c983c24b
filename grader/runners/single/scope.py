"""Which exercises one submission is meant to hold, and whether it can be graded at all.

``python -m grader exercises/ex01_leakage.ipynb`` grades chapter 1, out of chapter
1's points, not the whole course with eleven "not found" rows: a chapter
notebook (``exNN_*.ipynb``) holds chapter NN; any other notebook or ``.py`` file
holds the exercise functions it defines at top level (all of them if it defines
none, so that "not found" says what is missing); a folder holds everything.
Used by the CLI only: class mode and Gradescope grade a whole hand-in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import submission

_CHAPTER = re.compile(r"^ex(\d+)_")


@dataclass(frozen=True)
class Scope:
    """The exercises to grade (``None``: all) and, when that is not all, what they are."""

    names: list[str] | None
    label: str = ""  # "chapter 1", "mine.py"; "" for the whole course


def usage_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be a submission (missing, an empty folder, not a notebook), else None."""
    p = Path(path)
    hint = "pass an exercise notebook (.ipynb), a .py file, or the folder holding them (e.g. exercises/)"
    if not p.exists():
        return f"{path} does not exist; {hint}"
    if p.is_dir():
        try:
            if not submission.files_in(p):
                return f"the folder {path} holds no notebooks (.ipynb) or .py files; {hint}"
        except OSError as e:
            return f"the folder {path} cannot be read ({e.strerror}); {hint}"
        return None
    if p.suffix not in submission.SUFFIXES:
        return f"{path} is not a notebook (.ipynb) or a .py file; {hint}"
    return None


def scope_of(path: str | os.PathLike, registry: Mapping[str, Any]) -> Scope:
    """What the submission at ``path`` is meant to hold (never raises: unreadable means all)."""
    p = Path(path)
    if p.is_dir() or not p.is_file():
        return Scope(None)
    m = _CHAPTER.match(p.name)
    if p.suffix == ".ipynb" and m:
        chapter = int(m.group(1))
        names = [n for n, ex in registry.items() if int(ex.chapter) == chapter]
        if names:
            return Scope(names, f"chapter {chapter}")
    try:
        src = submission.read(p)
    except submission.SubmissionError:
        return Scope(None)
    defined: set[str] = set()
    for cell in src.cells:
        defined |= submission.defined_names(cell)
    names = [n for n in registry if n in defined]
    if not names or len(names) == len(registry):
        return Scope(None)
    return Scope(names, p.name)
