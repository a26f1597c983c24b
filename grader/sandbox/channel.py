"""Plain data from the worker to the trusted process, and nothing else.

A record is ``MAGIC``, the length of a pickle, the pickle, then the raw bytes of
every tensor. The pickle holds only containers, numbers and strings; each
tensor in it is a persistent id ``("tensor", dtype, shape, offset, nbytes)``
pointing into the raw bytes. Reading uses a restricted unpickler: it resolves
no global but ``complex`` (so no code runs while loading) and rebuilds tensors
itself from validated dtypes, shapes and byte ranges -- the same guarantee as
``torch.load(weights_only=True)``, several times faster on small records.

The worker appends its records to a :class:`Log`: one file per worker, which the
parent creates and hands over as a descriptor (the worker sees no folder of the
parent's, so it can create no file there), at most ``MAX_FILE_BYTES`` long (the
worker's ``RLIMIT_FSIZE``: what one student writes there cannot fill the disk
for another). It announces each complete record as ``OFFSET LENGTH`` on its
status pipe, and the parent reads exactly that range (:func:`decode`).

After loading, :func:`plain` re-validates every value: only
``type(t) is torch.Tensor`` (strided, on the CPU), numbers, strings, None, and
tuples/lists/dicts of them pass, within a depth and a node budget (shared
references cannot make a small record expensive to walk). Anything else -- a
forged object, a malformed header, a record too big -- becomes a
:class:`ChannelError` with a plain message, which fails the check it belongs
to. Student code can write whatever it likes into these files: the worst it
can forge is what its own calls produced: their return values and, for a call
that asks, the record of the largest tensor it created (which deliberate code
can also dodge by computing outside torch, e.g. in numpy; see
:class:`grader.sandbox.execute.Allocations`). What the parent makes of a record
is bounded too, whatever its bytes say: no tensor's bytes are read twice, no
integer beyond 64 bits, at most :data:`MAX_CHARS` characters of text, a call's
time a finite number of seconds (:func:`outcome_from_data`) and the loaded
record's names and errors few and short (:func:`loaded_from_data`).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
from typing import Any

import torch

from ..spec import NotATensor, Outcome
from .limits import ChannelError
from .status import RECORD_PARTS

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 32
MAX_NODES = 200_000  # values visited by plain() in one file
MAX_STRING = 100_000
MAX_CHARS = 2_000_000  # characters of text in one record, shared references counted each time
MAX_ERROR = 4000  # characters of a call's error kept (feedback quotes 300)
MAX_INT = 2**64
MAGIC = b"attnmask-channel-1\n"
_NOT_A_TENSOR = "__not_a_tensor__"
# Every dtype a returned tensor may have (a wrong one is the judges' to name, not ours to refuse).
_DTYPES = {name: getattr(torch, name) for name in (
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "bool",
    "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
) if isinstance(getattr(torch, name, None), torch.dtype)}


class _Writer(pickle.Pickler):
    """Pickles containers; puts each tensor's bytes after the pickle (see the module's docstring)."""

    def __init__(self, file, raw: list[bytes]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.raw, self.offset = raw, 0

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        t = obj.detach().cpu().contiguous().reshape(-1)
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        name = str(obj.dtype).removeprefix("torch.")
        if _DTYPES.get(name) != obj.dtype:
            raise TypeError(f"tensors of dtype {obj.dtype} cannot come back")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        pid = ("tensor", name, [int(n) for n in obj.shape], self.offset, len(data))
        self.raw.append(data)
        self.offset += len(data)
        return pid


class _Reader(pickle.Unpickler):
    def __init__(self, file, raw: memoryview):
        super().__init__(file)
        self.raw = raw
        self.taken = 0  # bytes of raw turned into tensors: the writer uses each byte once

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    def persistent_load(self, pid: Any) -> torch.Tensor:
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "tensor":
            raise pickle.UnpicklingError("a malformed tensor record")
        _, name, shape, offset, nbytes = pid
        dtype = _DTYPES.get(name) if type(name) is str else None
        if dtype is None:
            raise pickle.UnpicklingError(f"tensor dtype {name!r} is not allowed")
        if (type(shape) is not list or len(shape) > 64
                or any(type(n) is not int or not 0 <= n < 2**40 for n in shape)):
            raise pickle.UnpicklingError("a malformed tensor shape")
        numel = 1
        for n in shape:
            numel *= n
        size = 1 if dtype == torch.bool else torch.empty((), dtype=dtype).element_size()
        if (type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes != numel * size
                or offset + nbytes > len(self.raw)):
            raise pickle.UnpicklingError("a tensor's bytes do not match its shape")
        self.taken += nbytes
        if self.taken > len(self.raw):  # the same bytes referenced many times: gigabytes from megabytes
            raise pickle.UnpicklingError("tensors share bytes")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(self.raw[offset:offset + nbytes]), dtype=torch.uint8)
        if dtype == torch.bool:
            return (flat != 0).reshape(shape)  # any byte but 0 is True: no invalid bools
        return flat.view(dtype).reshape(shape)


def too_big(nbytes: int) -> str | None:
    """The message for a record of ``nbytes``, if that is over the limit."""
    if nbytes <= MAX_FILE_BYTES:
        return None
    return f"the returned values take {nbytes // 2**20} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB"


def encode(obj: Any) -> bytes:
    """One record: ``obj`` (plain data) in the format above."""
    raw: list[bytes] = []
    buf = io.BytesIO()
    _Writer(buf, raw).dump(obj)
    return b"".join([MAGIC, struct.pack("<Q", buf.tell()), buf.getvalue(), *raw])


def decode(data: bytes) -> Any:
    """Parent side: the validated value of one record; :class:`ChannelError` on anything odd."""
    if message := too_big(len(data)):
        raise ChannelError(message)
    try:
        head = len(MAGIC) + 8
        if len(data) < head or not data.startswith(MAGIC):
            raise ValueError("not a channel record")
        (n,) = struct.unpack("<Q", data[len(MAGIC):head])
        if n > len(data) - head:
            raise ValueError("truncated")
        view = memoryview(data)
        obj = _Reader(io.BytesIO(view[head:head + n]), view[head + n:]).load()
    except Exception as e:  # noqa: BLE001 -- any unpickling failure means "not plain data"
        raise ChannelError(f"the returned values are not plain data ({type(e).__name__})") from None
    return plain(obj, budget=[MAX_NODES, MAX_CHARS])


class Log:
    """Worker side: records appended to the results file the parent handed over as ``fd``."""

    ANNOUNCEMENT = re.compile(" ".join(f"({part})" for part in RECORD_PARTS))  # OFFSET LENGTH

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def parse(cls, where: str) -> tuple[int, int]:
        """Parent side: (offset, length) of an announced record."""
        m = cls.ANNOUNCEMENT.fullmatch(where)
        if m is None:
            raise ChannelError("the worker announced a result it did not write")
        return int(m[1]), int(m[2])

    def append(self, obj: Any) -> str:
        """Write one record; ``"OFFSET LENGTH"`` to announce it by (once it is complete).
        Raises ValueError past the file's limit, OSError if student code closed the descriptor."""
        data = encode(obj)
        offset = os.lseek(self.fd, 0, os.SEEK_END)
        if offset + len(data) > MAX_FILE_BYTES:
            whole = f"this grading's results would pass {MAX_FILE_BYTES // 2**20} MiB"
            raise ValueError(too_big(len(data)) or whole)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        return f"{offset} {len(data)}"


def plain(x: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A validated copy of ``x``; raises :class:`ChannelError` on anything not plain.
    ``budget``: how many more values and characters may be visited ([values, characters], shared
    down the walk)."""
    if depth > MAX_DEPTH:
        raise ChannelError(f"the returned values nest deeper than {MAX_DEPTH} levels")
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ChannelError(f"the returned values hold more than {MAX_NODES} items")
    if type(x) is int and not -MAX_INT < x < MAX_INT:
        raise ChannelError("a returned integer is beyond 64 bits")
    if x is None or type(x) in (bool, int, float, complex):
        return x
    if type(x) is str:
        if budget is not None:
            budget[1] -= min(len(x), MAX_STRING)
            if budget[1] < 0:
                raise ChannelError(f"the returned values hold more than {MAX_CHARS} characters of text")
        if len(x) > MAX_STRING:
            return x[:MAX_STRING] + " [truncated]"
        return x
    if type(x) is torch.Tensor:
        if x.layout != torch.strided or x.is_quantized or x.device.type != "cpu":
            raise ChannelError(f"a returned tensor has layout {x.layout} on {x.device}; "
                               "only dense CPU tensors come back")
        return x.detach()
    if type(x) in (tuple, list):
        items = [plain(v, depth + 1, budget) for v in x]
        return tuple(items) if type(x) is tuple else items
    if type(x) is dict:
        out = {}
        for k, v in x.items():
            if type(k) not in (str, int):
                raise ChannelError(f"a dict key of type {type(k).__name__} came back")
            out[k] = plain(v, depth + 1, budget)
        return out
    raise ChannelError(f"a value of type {type(x).__name__} came back; only plain data may")


# --------------------------------------------------------------------------- Outcome <-> data


def _encode(x: Any) -> Any:
    if isinstance(x, NotATensor):
        return {_NOT_A_TENSOR: x.type_name}
    if isinstance(x, tuple | list):
        return type(x)(_encode(v) for v in x)
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    return x


def _decode(x: Any) -> Any:
    if type(x) is dict:
        if set(x) == {_NOT_A_TENSOR} and type(x[_NOT_A_TENSOR]) is str:
            return NotATensor(x[_NOT_A_TENSOR])
        return {k: _decode(v) for k, v in x.items()}
    if type(x) in (tuple, list):
        return type(x)(_decode(v) for v in x)
    return x


def outcome_to_data(o: Outcome) -> dict:
    return {
        "output": _encode(o.output),
        "error": o.error,
        "devices": _encode(o.devices),
        "args_after": _encode(o.args_after),
        "grads": _encode(o.grads),
        "seconds": float(o.seconds),
        "where": getattr(o, "where", None),
        "largest": o.largest,
    }


def outcome_from_data(d: Any) -> Outcome:
    """Rebuild an :class:`Outcome` from validated data, checking each field's type."""
    if type(d) is not dict:
        raise ChannelError("a call's record is not a dict")
    error = d.get("error")
    if error is not None and type(error) is not str:
        raise ChannelError("a call's error is not a string")
    seconds = d.get("seconds", 0.0)
    if type(seconds) not in (int, float) or not 0 <= seconds < 1e6:  # NaN fails the comparison too
        raise ChannelError("a call's time is not a number of seconds")
    args_after = d.get("args_after")
    if args_after is not None and type(args_after) not in (tuple, list):
        raise ChannelError("a call's arguments-after record is not a sequence")
    where = d.get("where")
    largest = d.get("largest")
    if largest is not None and (type(largest) not in (tuple, list) or len(largest) > 64
                                or any(type(n) is not int or n < 0 for n in largest)):
        raise ChannelError("a call's record of its largest tensor is not a shape")
    return Outcome(
        output=_decode(d.get("output")),
        error=None if error is None else error[:MAX_ERROR],
        devices=_decode(d.get("devices")),
        args_after=None if args_after is None else tuple(_decode(args_after)),
        grads=_decode(d.get("grads")),
        seconds=float(seconds),
        where=where[:300] if type(where) is str else None,
        largest=None if largest is None else tuple(largest),
    )


def loaded_from_data(d: Any, names: int = 64, errors: int = 50) -> dict:
    """The loaded record (``{"found": {name: where}, "errors": [text]}``), checked and cut:
    at most ``names`` names and ``errors`` errors, each a short string."""
    if type(d) is not dict or type(d.get("found")) is not dict or type(d.get("errors", [])) is not list:
        raise ChannelError("the loaded record is not {found: dict, errors: list}")
    found = {k[:100]: v[:300] for k, v in list(d["found"].items())[:names]
             if type(k) is str and type(v) is str}
    return {"found": found, "errors": [e[:500] for e in d.get("errors", [])[:errors] if type(e) is str]}
