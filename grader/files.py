"""A submission's files, read as files: never through a link, never a pipe or a device.

Everything in a submission is the student's to choose. A notebook can be a
symbolic link to the course's ``solutions/``, to another student's file or to
``/dev/zero``; a FIFO that never answers; a socket. The grader reads none of
them: :func:`listing` walks a folder without following links and names every
entry that is not a plain file or folder, and :func:`read` opens a file one
path component at a time, each with ``O_NOFOLLOW`` below the submission's own
folder (so a link anywhere in the path is refused, and no ``..`` leads out), checks
with ``fstat`` that what it opened is a regular file, and reads at most a limit.
Text only, no torch: the engine, the class roster and the hashing of class mode
all read submissions through here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Entries of one submission looked at (files and folders); the course's exercises are about 10.
MAX_ENTRIES = 5000
MAX_DEPTH = 32
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def kind(mode: int) -> str:
    """What an entry that is not a plain file is, in words: "a symbolic link", "a device", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


class NotAFile(OSError):
    """An entry the grader does not read: a link, a pipe, a device, a socket, or too big."""


@dataclass
class Listing:
    """What :func:`listing` found below a folder: plain files, and the entries it refused."""

    files: list[Path] = field(default_factory=list)  # relative to the folder, in sorted order
    refused: list[tuple[Path, str]] = field(default_factory=list)  # (relative path, what it is)
    truncated: bool = False  # more than MAX_ENTRIES entries, or deeper than MAX_DEPTH

    def problems(self, label: Callable[[Path], str] = str) -> list[str]:
        """One line per refused entry, for the report."""
        out = [f"{label(p)} is {what}: the grader reads only plain files, so it was not read"
               for p, what in self.refused[:20]]
        if len(self.refused) > 20:
            out.append(f"and {len(self.refused) - 20} more entries that are not plain files, not read")
        if self.truncated:
            out.append(f"the submission holds more than {MAX_ENTRIES} files or folders, or folders "
                       f"nested deeper than {MAX_DEPTH}: only the first were looked at")
        return out


def listing(root: Path, keep: Callable[[str], bool] = lambda name: True,
            skip_dir: Callable[[str], bool] = lambda name: False) -> Listing:
    """The entries below ``root`` whose names ``keep`` accepts, sorted, without following links.

    Folders whose names ``skip_dir`` accepts are not entered; a link to a folder is refused
    (named) like any link. Never raises for what is inside ``root``: a folder that cannot be
    read is left out.
    """
    out = Listing()
    seen = 0
    stack: list[tuple[Path, int]] = [(Path(), 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(root / rel) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        below = []
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                out.truncated = True
                break
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            path = rel / entry.name
            if stat.S_ISDIR(mode):
                if not skip_dir(entry.name):
                    below.append(path)
            elif stat.S_ISREG(mode):
                if keep(entry.name):
                    out.files.append(path)
            elif keep(entry.name) or (stat.S_ISLNK(mode) and "." not in entry.name
                                      and not skip_dir(entry.name)):  # a link that may be a folder
                out.refused.append((path, kind(mode)))
        if depth + 1 > MAX_DEPTH and below:
            out.truncated = True
        else:
            stack.extend((p, depth + 1) for p in reversed(below))
    out.files.sort()
    out.refused.sort()
    return out


def read(root: Path, rel: Path | str, limit: int) -> bytes:
    """The bytes of ``root / rel``, at most ``limit`` of them, opened without following any link
    below ``root``; :class:`NotAFile` for a link, a pipe, a device, a socket or a file over
    ``limit``, OSError for what cannot be opened."""
    parts = Path(rel).parts
    if not parts or any(p in ("", ".", "..") or os.sep in p for p in parts):
        raise NotAFile(f"{rel} is not a path inside the submission")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK | os.O_NOCTTY if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                mode = _lstat_mode(part, fd)
                if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise NotAFile(f"it is {kind(mode)}") from None
                raise e from None
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"it is {kind(st.st_mode)}")
        if st.st_size > limit:
            raise NotAFile(f"{st.st_size // 2**20} MiB is over the {limit // 2**20} MiB limit")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(2**20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while we read it
            raise NotAFile(f"it is over the {limit // 2**20} MiB limit")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _lstat_mode(name: str, dir_fd: int) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None
