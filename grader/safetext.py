"""Text from a submission or a shard, made safe to write anywhere: one rule for all of it.

Everything a student hands in is hostile input to the grading process: its file and
folder names (bytes that are not UTF-8 come back from the OS as lone surrogates, which
no UTF-8 file can hold), what its code raised or printed (a lone surrogate, an escape
sequence that clears the instructor's terminal, a bidirectional override), and the
names a shard's record gives its students. :func:`text` and :func:`name` turn any of
it into printable UTF-8, bounded, with every character that is not printable written
as a visible escape (``\\x1b``, ``\\xff`` for a byte that was not UTF-8), so two names
that differ only there stay two names. :func:`component` says whether a name from a
record may be used as one folder name inside an output folder. The engine cleans a
report with :func:`clean` before anything writes it; class mode and ``merge`` clean
names where they read them.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any

#: Characters of one name (a student, a file) shown; the rest is cut.
NAME_CHARS = 200
#: Characters of one text (a message, what the code printed) kept; the engine bounds most before.
TEXT_CHARS = 1_000_000


def _escape(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode gives it
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _cut(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[: limit - 1] + "…"


def text(s: Any, limit: int = TEXT_CHARS) -> str:
    """``s`` as printable UTF-8: newlines and tabs kept, every other character that is not
    printable (controls, escapes, lone surrogates, bidirectional overrides) escaped, at most
    ``limit`` characters."""
    s = s if isinstance(s, str) else str(s)
    if s.isprintable():
        return _cut(s, limit)
    return _cut("".join(ch if ch.isprintable() or ch in "\n\t" else _escape(ch) for ch in s), limit)


def name(s: Any, limit: int = NAME_CHARS) -> str:
    """A name (of a student, a file) on one line: as :func:`text`, newlines and tabs escaped too."""
    s = s if isinstance(s, str) else str(s)
    return _cut("".join(ch if ch.isprintable() else _escape(ch) for ch in s), limit)


_COMPONENT = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


def component(s: Any) -> bool:
    """Whether ``s`` may name one folder inside an output folder: the characters class mode
    gives a slug (:func:`grader.runners.classmode.roster.discover`), not ``.`` or ``..``, no separator."""
    return isinstance(s, str) and bool(_COMPONENT.fullmatch(s)) and s not in (".", "..")


def map_strings(x: Any, fn: Callable[[str], str]) -> Any:
    """``x`` (a report, a row, plain containers of strings) with ``fn`` applied to every string
    in it, keys included; dataclasses are copied, never changed in place."""
    if isinstance(x, str):
        return fn(x)
    if isinstance(x, list | tuple):
        return type(x)(map_strings(v, fn) for v in x)
    if isinstance(x, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = copy.copy(x)
        for f in dataclasses.fields(x):
            setattr(x, f.name, map_strings(getattr(x, f.name), fn))
    return x


def clean(x: Any) -> Any:
    """``x`` with every string in it :func:`text` (see :func:`map_strings`)."""
    return map_strings(x, text)
