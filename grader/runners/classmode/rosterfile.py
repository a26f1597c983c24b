"""A class roster from a CSV file: who should have handed something in.

``--roster roster.csv`` gives every student of the roster a row of grades.csv, those who
submitted nothing included ("missing"). Three layouts are read as they come:

* our own: ``id,name`` and optionally ``folder`` (or ``repo``), ``extension_days``,
  ``due`` (this student's own due date, ISO 8601) and ``submitted`` (when they handed in);
* GitHub Classroom's roster download: ``identifier,github_username,github_id,name``; the
  folder is the GitHub user name, as the instructor workflow names the clones;
* Gradescope's roster download: ``First Name``/``Last Name`` (or ``Name``/``Full Name``),
  ``SID``, ``Email`` and ``Role``; only rows whose role is Student count.

A student's submission is found by the first of: the ``folder`` column, the id, the
GitHub user name, the email's local part and the name, compared with the folder and
file names class mode found (case ignored).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

#: A submission that is one file: the roster's ``folder`` may name it with or without its suffix.
FILE_SUFFIXES = (".ipynb", ".py")


@dataclass(frozen=True)
class Enrolled:
    id: str
    name: str
    keys: tuple[str, ...]  # what a submission's folder may be called, best first
    extension_days: float = 0.0
    due: str | None = None  # ISO 8601, this student's own due date
    submitted: str | None = None  # ISO 8601, when the roster says they handed in

    @property
    def shard_key(self) -> str:
        """What places this student in a shard (:mod:`.shards`), found or not: their folder's name
        when the roster gives one, so a shard that cloned only its own students agrees."""
        return self.keys[0] if self.keys else self.id


def wants(e: Enrolled) -> str:
    """What a roster entry found nothing under, in the roster's words: the "missing" row's message."""
    if not e.keys:
        return "no submission found"
    return (f"no submission found: the roster's {e.keys[0]!r} names no folder or file of the class "
            f"(a sub-folder's name, or a notebook's or .py file's name, with or without its suffix)")


def _norm(text: str) -> str:
    return text.strip().lower()


def _col(row: dict[str, str], *names: str) -> str:
    lowered = {_norm(k): (v or "").strip() for k, v in row.items() if k is not None}
    for n in names:
        if lowered.get(_norm(n)):
            return lowered[_norm(n)]
    return ""


def read(path: Path) -> list[Enrolled]:
    """The students of a roster CSV in any of the three layouts; a SystemExit says what is wrong."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets write a BOM
    except OSError as e:
        raise SystemExit(f"cannot read the roster {path}: {e}") from None
    rows = list(csv.DictReader(text.splitlines()))
    header = {_norm(h) for h in (rows[0].keys() if rows else []) if h is not None}
    if not rows:
        raise SystemExit(f"the roster {path} has no students (expected a header line and one line per "
                         f"student).")
    if "github_username" in header:
        kind = "GitHub Classroom"
    elif "sid" in header and ({"first name", "name", "full name"} & header):
        kind = "Gradescope"
    elif {"id", "name"} & header:
        kind = "ours"
    else:
        raise SystemExit(f"the roster {path} has columns {sorted(header)}; expected id,name[,folder] "
                         f"(or GitHub Classroom's identifier,github_username,github_id,name, or Gradescope's "
                         f"First Name,Last Name,SID,Email,Role).")
    out, seen = [], set()
    for line, row in enumerate(rows, start=2):
        if kind == "Gradescope" and _col(row, "role") and _norm(_col(row, "role")) != "student":
            continue
        if kind == "GitHub Classroom":
            ident, name = _col(row, "identifier", "github_username"), _col(row, "name", "identifier")
            keys = [_col(row, "github_username"), ident]
        elif kind == "Gradescope":
            full = _col(row, "name", "full name") or " ".join(
                filter(None, [_col(row, "first name"), _col(row, "last name")]))
            ident, name = _col(row, "sid", "email") or full, full
            keys = [_col(row, "sid"), _col(row, "email"), _col(row, "email").split("@")[0], full]
        else:
            ident, name = _col(row, "id", "name"), _col(row, "name", "id")
            keys = [_col(row, "folder", "repo", "repository"), ident, name]
        if not ident:
            continue  # an empty line of a spreadsheet
        if ident in seen:
            raise SystemExit(f"the roster {path} lists {ident!r} twice (line {line}): each student once, "
                             f"please.")
        seen.add(ident)
        try:
            ext = float(_col(row, "extension_days", "extension") or 0)
        except ValueError:
            raise SystemExit(f"the roster {path}, line {line}: extension_days must be a number of days; "
                             f"got {_col(row, 'extension_days', 'extension')!r}.") from None
        out.append(Enrolled(id=ident, name=name or ident, keys=tuple(k for k in keys if k),
                            extension_days=ext, due=_col(row, "due") or None,
                            submitted=_col(row, "submitted", "submission_timestamp") or None))
    return out


def match(enrolled: list[Enrolled], found: list[str]) -> tuple[dict[str, str], list[str]]:
    """Roster id -> the found submission name, and the found names on nobody's roster.

    A submission goes to at most one student: the first roster entry whose key names it."""
    by_key = {_norm(n): n for n in found}
    taken: dict[str, str] = {}
    owner: dict[str, str] = {}
    for e in enrolled:
        for k in e.keys:
            name = Path(k).name
            stem = Path(name).stem if name.lower().endswith(FILE_SUFFIXES) else name
            # class mode names a lone notebook by its stem: the roster may give "s29.ipynb" or "s29"
            hit = by_key.get(_norm(k)) or by_key.get(_norm(name)) or by_key.get(_norm(stem))
            if hit is not None and hit not in taken:
                taken[hit], owner[e.id] = e.id, hit
                break
    strangers = [n for n in found if n not in taken]
    return owner, strangers
