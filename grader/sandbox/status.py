"""The status pipe's lines, read as what they are: bytes student code can write.

The worker announces each event with one line (see :mod:`grader.sandbox.worker`)::

    ready KEY=VALUE ...     refused WHY     cell I     loaded RECORD     start E
    check E C RECORD        half E          public     resume E          done E     bye DROPPED

(``start``/``half`` frame an exercise's public checks, ``resume``/``done`` its hidden ones,
and ``public`` asks for the hidden checks once every exercise's public ones ran)

where a RECORD is ``OFFSET LENGTH`` in the worker's results file (:class:`grader.sandbox.channel.Log`).
Student code can find the pipe and write to it, so :class:`Lines` keeps at most
:data:`MAX_LINE` bytes of a line that has not ended, and :func:`parse` accepts
only this grammar, with numbers of at most :data:`MAX_DIGITS` digits: a
5000-digit number, a line of a megabyte without a newline, a word it does not
know or bytes that are not ASCII are each a :class:`~grader.sandbox.limits.ChannelError`,
which the parent charges to the submission (:data:`UNREADABLE`), never its own crash.
"""

from __future__ import annotations

import re

from .limits import ChannelError

MAX_LINE = 512  # bytes; the longest line the worker writes is about 60
MAX_DIGITS = 9
#: What the report says when the worker's side sent something that breaks these rules.
UNREADABLE = "sent data the grader cannot read (did it write to the grader's status pipe or files?)"

_N = rf"(\d{{1,{MAX_DIGITS}}})"
#: A record's announcement, ``OFFSET LENGTH`` (see :class:`grader.sandbox.channel.Log`).
RECORD_PARTS = (r"\d{1,12}", r"\d{1,12}")
_RECORD = f"({' '.join(RECORD_PARTS)})"
_GRAMMAR = {
    "ready": re.compile(r"([ -~]{0,400})"),  # what the worker measured; read by the supervisor, bounded
    "refused": re.compile(r"([ -~]{0,400})"),  # why the sandbox could not be made (the zygote's words)
    "cell": re.compile(_N),
    "loaded": re.compile(_RECORD),
    "start": re.compile(_N),
    "check": re.compile(rf"{_N} {_N} {_RECORD}"),
    "half": re.compile(_N),
    "public": re.compile(r""),
    "resume": re.compile(_N),
    "done": re.compile(_N),
    "bye": re.compile(rf"{_N}?"),
}


class Lines:
    """Complete lines out of the chunks read from the pipe, each at most :data:`MAX_LINE` bytes.

    The lines before a bad one come out as they are; the bad one becomes a line that
    :func:`parse` refuses with the reason, in its place, and nothing after it is read.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._broken = False

    def feed(self, chunk: bytes) -> list[str]:
        if self._broken:
            return []
        *done, self._buf = (self._buf + chunk).split(b"\n")
        out = []
        for i, line in enumerate(done + [self._buf]):
            if len(line) > MAX_LINE:
                why = f"a status line longer than {MAX_LINE} bytes"
            elif not line.isascii():
                why = "a status line that is not ASCII"
            elif i < len(done):
                out.append(line.decode("ascii"))
                continue
            else:
                return out  # the unfinished last line waits for its end
            self._broken, self._buf = True, b""
            return out + [_BAD + why]
        return out


_BAD = "\x00"  # starts the line that stands for a bad one; no line the worker writes can hold it


def parse(line: str) -> tuple[str, list[str | int]]:
    """``(word, fields)`` of one status line: numbers as ints, a RECORD as its text.

    Raises :class:`~grader.sandbox.limits.ChannelError` on anything outside the grammar above.
    """
    if line.startswith(_BAD):
        raise ChannelError(line[1:])
    word, _, rest = line.strip().partition(" ")
    pattern = _GRAMMAR.get(word)
    m = pattern.fullmatch(rest) if pattern is not None else None
    if m is None:
        raise ChannelError(f"a status line the grader does not know ({line[:40]!r})")
    if word in ("ready", "refused"):
        return word, rest.split()
    return word, [int(g) if g.isdigit() else g for g in m.groups() if g is not None]
