"""What a worker leaves behind, read back by the parent: the records in its results file
(:func:`receive`, :func:`receive_record`), what it printed (:func:`output_tail`) and the
student's line a crash dump names (:func:`crash_site_in`).

Every byte of these files is student code's to write: each is opened without following
links or blocking, read with bounded sizes, and decoded without pickle
(:mod:`grader.sandbox.channel`, imported only when a record is read: it imports torch).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

TAIL_CHARS = 1000

_DUMP = re.compile(r"Fatal Python error.*?(\nExtension modules:[^\n]*|\Z)", re.S)
_FRAME = re.compile(r'^\s*File "<(.+?)>", line (\d+)')


def crash_site_in(text: str) -> str | None:
    """The student's innermost line in a faulthandler dump ("most recent call first")."""
    dump = text[text.rfind("Fatal Python error"):] if "Fatal Python error" in text else ""
    for line in dump.splitlines():
        m = _FRAME.match(line)
        if m and not m.group(1).startswith("frozen"):
            return f"line {m.group(2)} of {m.group(1)}"
    return None


def receive(path: Path, offset: int = 0, length: int | None = None) -> Any:
    """:func:`grader.sandbox.channel.decode` for ``length`` bytes at ``offset`` of a file whose
    bytes student code wrote (all of it if no length).

    Opened without following links or blocking (a symlink to one of our files,
    a FIFO that never answers), and read only if it is a plain file.
    """
    from . import channel

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise channel.ChannelError("the worker wrote no result (or not as a plain file)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise channel.ChannelError("the worker's result is not a plain file")
        length = st.st_size - offset if length is None else length
        if message := channel.too_big(length):
            raise channel.ChannelError(message)
        data = os.pread(fd, length, offset) if length > 0 else b""
        if len(data) != length:
            raise channel.ChannelError("the worker's result was cut short")
        return channel.decode(data)
    finally:
        os.close(fd)


def receive_record(results: Path, where: str) -> Any:
    """The record a worker announced as ``OFFSET LENGTH`` in its ``results`` file (see
    :class:`grader.sandbox.channel.Log`)."""
    from . import channel

    offset, length = channel.Log.parse(where)
    return receive(results, offset, length)


def output_tail(tmp: Path, keep: int = TAIL_CHARS, width: int = 200) -> str:
    """What student code printed: the start and the end, long lines cut."""
    parts = []
    for name in ("stdout.txt", "stderr.txt"):
        try:
            with open(tmp / name, "rb") as f:
                data = f.read(8 * keep)
                size = os.fstat(f.fileno()).st_size
                if size > 8 * keep:
                    f.seek(size - 8 * keep)
                    data += f.read()
        except OSError:
            continue
        # The crash dump names grader internals; the crash message already gives the student's line.
        text = _DUMP.sub("[a crash dump, left out]", data.decode("utf-8", "replace"))
        if not text.strip():
            continue
        if size > 2 * keep:
            text = f"{text[:keep]}\n[... {size - 2 * keep} characters left out ...]\n{text[-keep:]}"
        lines = [line if len(line) <= width else line[:width] + " [...]" for line in text.splitlines()]
        parts.append(f"--- {name[:-4]} ---\n" + "\n".join(lines).rstrip())
    return "\n".join(parts)
