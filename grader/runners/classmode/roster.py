"""Who is in the class: one student per sub-folder or notebook of SUBMISSIONS_DIR.

:func:`discover` names the students and gives each a safe output folder,
:func:`content_hash` fingerprints a submission's files (so an unchanged one is not
regraded) and :func:`grading_target` picks what of a submission the engine grades.
All three read a submission as :mod:`grader.files` does: no link is followed, no pipe
or device is opened, so one student's symlink to a FIFO or to ``/dev/zero`` costs
that student's row, not the class.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from ... import files, safetext

#: Files the engine grades; anything else in SUBMISSIONS_DIR is not a student.
SOURCE_SUFFIXES = (".ipynb", ".py")
#: Folders that never belong to a submission's content (editor and VCS debris).
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git"}
#: Bytes of one file hashed (the engine reads at most 8 MiB of one); a bigger one is hashed by its size.
MAX_HASHED_BYTES = 64 * 2**20


@dataclass
class Student:
    name: str  # as it appears in grades.csv: folder name or file stem
    path: Path  # the sub-folder or file in SUBMISSIONS_DIR
    slug: str  # safe folder name for OUT/slug/


def _is_hidden(p: Path) -> bool:
    return p.name.startswith(".")


def slug_of(name: str) -> str:
    """A safe folder name for a student: accents transliterated (NFKD: ``Zoë`` -> ``Zoe``), then
    every character that is not an ASCII letter, digit or ``._@+-`` replaced by ``_``."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    return re.sub(r"[^A-Za-z0-9._@+-]", "_", plain, flags=re.ASCII) or "_"


def refuse_case_twins(named: list[tuple[Path, str]]) -> None:
    """Two students whose names differ only by case (``Bob`` and ``bob``) are refused, both named:
    logins, LMS exports and case-insensitive file systems take them for one person."""
    seen: dict[str, Path] = {}
    twins = []
    for p, name in named:
        key = name.casefold()
        if key in seen:
            twins.append(f"{safetext.name(seen[key].name)!r} and {safetext.name(p.name)!r}")
        else:
            seen[key] = p
    if twins:
        raise SystemExit(f"class mode found students whose names differ only by case: {'; '.join(twins)}. "
                         "A login, a gradebook export and many file systems take them for the same student, "
                         "so nothing was graded: rename or merge those folders (one folder per student).")


def discover(submissions: Path, out: Path | None = None) -> tuple[list[Student], list[Path]]:
    """Students of SUBMISSIONS_DIR, sorted by name, and the entries that are not students."""
    if not submissions.is_dir():
        raise SystemExit(f"class mode expected a folder of submissions (one sub-folder or notebook per "
                         f"student); got {str(submissions)!r}, which is "
                         f"{'a file' if submissions.exists() else 'missing'}. Pass the folder that holds "
                         f"the students' submissions.")
    entries, ignored = [], []
    out_resolved = out.resolve() if out is not None else None
    for p in sorted(submissions.iterdir()):
        if _is_hidden(p) or p.name in _SKIP_DIRS or (out_resolved and p.resolve() == out_resolved):
            continue
        if p.is_symlink() and (p.suffix in SOURCE_SUFFIXES or p.is_dir()):
            entries.append(p)  # a student whose submission is a link: its row says so (never followed)
        elif p.is_dir() or (p.is_file() and p.suffix in SOURCE_SUFFIXES):
            entries.append(p)
        else:
            ignored.append(p)
    stems: dict[str, int] = {}
    for p in entries:
        key = p.name if p.is_dir() else p.stem
        stems[key] = stems.get(key, 0) + 1
    named = [(p, p.name if p.is_dir() or stems[p.stem] > 1 else p.stem) for p in entries]
    refuse_case_twins(named)
    students, slugs = [], set()
    for p, name in named:
        slug = slug_of(name)
        base, k = slug, 2
        while slug in slugs:  # two names that differ only in unsafe characters
            slug, k = f"{base}-{k}", k + 1
        slugs.add(slug)
        students.append(Student(name=safetext.name(name), path=p, slug=slug))  # bytes, escapes: shown
    return students, ignored


def _source_files(path: Path) -> list[Path]:
    """The submission's files, plain or not (links, pipes, devices are listed, never followed)."""
    if not path.is_dir() or path.is_symlink():
        return [path]
    found = files.listing(path, keep=lambda name: not name.startswith("."),
                          skip_dir=lambda name: name in _SKIP_DIRS or name.startswith("."))
    return [path / rel for rel in sorted([*found.files, *(rel for rel, _ in found.refused)])]


def content_hash(path: Path) -> str:
    """sha256 over the submission's files (relative names and bytes). Never raises, never blocks:
    a file that is not plain (a link, a pipe, a device) is hashed by its name and what it is."""
    h = hashlib.sha256()
    base = path if path.is_dir() and not path.is_symlink() else path.parent
    for f in _source_files(path):
        rel = f.relative_to(base)
        h.update(str(rel).encode() + b"\0")
        try:
            h.update(files.read(base, rel, MAX_HASHED_BYTES))
        except OSError as e:  # an unreadable file still changes the hash if it changes
            h.update(f"<not read: {e}>".encode())
        h.update(b"\0")
    return h.hexdigest()


def grading_target(path: Path) -> Path | None:
    """What to hand to the engine: the student's file or folder, or their ``exercises/``
    when they submitted a whole clone of the template repository. None when there is
    no notebook or .py file anywhere in it."""
    if path.is_file() or path.is_symlink():
        return path  # a link is handed over as it is: the engine names it and reads nothing
    if not any(f.suffix in SOURCE_SUFFIXES for f in _source_files(path)):
        return None
    exercises = path / "exercises"
    # A clone of the template repository also holds its own grader/ and attnmask/:
    # only the student's exercises are theirs to be graded.
    if exercises.is_dir() and any(f.suffix in SOURCE_SUFFIXES for f in _source_files(exercises)):
        return exercises
    return path


def no_class(submissions: Path, out: Path | None = None) -> str | None:
    """Why ``submissions`` holds no class to grade (missing, a file, no students), else None."""
    try:
        students, _ = discover(submissions, out)
    except SystemExit as e:  # not a folder: discover says so
        return str(e.code)
    if not students:
        return (f"{submissions} holds no students: expected one sub-folder, notebook (.ipynb) or .py file "
                "per student; nothing was graded")
    return None
