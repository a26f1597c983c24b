"""Plain data from the worker to the trusted process, and nothing else.

A record is a safetensors file (https://github.com/huggingface/safetensors, made for loading
tensors from sources nobody trusts): an 8-byte length, a JSON header, then raw bytes. Each
tensor the worker returns travels as one flat ``U8`` entry of the file (its bytes, named by
its index); the header's metadata holds ``tree``: the returned value as JSON, in which a
tensor is ``{"x": INDEX, "dtype": NAME, "shape": [...]}`` and the other values that JSON
lacks are tagged objects (``{"t": [...]}`` a tuple, ``{"d": [[key, value], ...]}`` a dict,
``{"c": [re, im]}`` a complex number). No pickle: nothing in a record is code, and nothing
is built before its size is known.

Reading (:func:`decode`) budgets before it allocates:

1. the record is at most ``MAX_FILE_BYTES`` (the parent reads no more);
2. its header's length, the first 8 bytes, is at most :data:`MAX_HEADER`, and the header
   opens at most :data:`MAX_NODES` JSON containers, both counted on the bytes before the
   JSON is parsed (a parsed container costs ~20 times its two bytes);
3. safetensors' own reader (Rust) checks that every entry's bytes lie inside the record,
   follow one another without gap or overlap, and match its shape: a header that claims
   gigabytes is refused before anything is allocated, and no byte is read twice;
4. the tree is rebuilt by :func:`_build`, which checks every node: only tensors (each
   entry used once, its dtype allowed and its byte count ``numel * element size``),
   numbers, strings, None, and tuples/lists/dicts of them, within a depth, a node and a
   character budget.

Anything else -- a forged object, a malformed header, a pickle, a record too big --
becomes a :class:`ChannelError` with a plain message, which fails the check it belongs to.

The worker appends its records to a :class:`Log`: one file per worker, which the
parent creates and hands over as a descriptor (the worker sees no folder of the
parent's, so it can create no file there), at most ``MAX_FILE_BYTES`` long (the
worker's ``RLIMIT_FSIZE``: what one student writes there cannot fill the disk
for another). It announces each complete record as ``OFFSET LENGTH`` on its
status pipe, and the parent reads exactly that range (:func:`decode`).

Student code can write whatever it likes into these files: the worst it
can forge is what its own calls produced: their return values and, for a call
that asks, the record of the largest tensor it created and of the most entries
alive at once (which deliberate code can also dodge by computing outside torch, e.g. in numpy; see
:class:`grader.sandbox.execute.Allocations`). What the parent makes of a record
is bounded too, whatever its bytes say: no integer beyond 64 bits, at most :data:`MAX_CHARS`
characters of text, a call's time a finite number of seconds (:func:`outcome_from_data`) and
the loaded record's names and errors few and short (:func:`loaded_from_data`).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import Any

import torch
from safetensors import SafetensorError, deserialize

from ..spec import NotATensor, Outcome
from .limits import ChannelError
from .status import RECORD_PARTS

MAX_FILE_BYTES = 64 * 2**20
MAX_HEADER = 2 * 2**20  # bytes of JSON in one record's header
MAX_DEPTH = 32
MAX_NODES = 200_000  # values in one record (and JSON containers in its header)
MAX_STRING = 100_000
MAX_CHARS = 2_000_000  # characters of text in one record
MAX_ERROR = 4000  # characters of a call's error kept (feedback quotes 300)
MAX_INT = 2**64
FORMAT = "attnmask-channel-2"
_NOT_A_TENSOR = "__not_a_tensor__"
# Every dtype a returned tensor may have (a wrong one is the judges' to name, not ours to refuse).
_DTYPES = {name: getattr(torch, name) for name in (
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "bool",
    "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
) if isinstance(getattr(torch, name, None), torch.dtype)}
_SIZES = {name: 1 if dtype == torch.bool else dtype.itemsize
          for name, dtype in _DTYPES.items()}


class _Writer:
    """The tree of one value, and the bytes of its tensors in order (worker side)."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []

    def tree(self, x: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"the returned values nest deeper than {MAX_DEPTH} levels")
        if x is None or type(x) in (bool, int, float):
            return x
        if type(x) is str:
            return x if len(x) <= MAX_STRING else x[:MAX_STRING] + " [truncated]"
        if type(x) is complex:
            return {"c": [x.real, x.imag]}
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if type(x) is list:
            return [self.tree(v, depth + 1) for v in x]
        if type(x) is tuple:
            return {"t": [self.tree(v, depth + 1) for v in x]}
        if type(x) is dict:
            return {"d": [[k, self.tree(v, depth + 1)] for k, v in x.items()]}
        raise TypeError(f"a value of type {type(x).__name__} cannot come back")

    def tensor(self, obj: torch.Tensor) -> dict:
        name = str(obj.dtype).removeprefix("torch.")
        if _DTYPES.get(name) != obj.dtype:
            raise TypeError(f"tensors of dtype {obj.dtype} cannot come back")
        t = obj.detach().cpu().contiguous().reshape(-1)
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        self.raw.append(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"x": len(self.raw) - 1, "dtype": name, "shape": [int(n) for n in obj.shape]}


def too_big(nbytes: int) -> str | None:
    """The message for a record of ``nbytes``, if that is over the limit."""
    if nbytes <= MAX_FILE_BYTES:
        return None
    return f"the returned values take {nbytes // 2**20} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB"


def encode(obj: Any) -> bytes:
    """One record: ``obj`` (plain data) in the format above. ValueError where its header
    would pass :data:`MAX_HEADER`."""
    writer = _Writer()
    tree = json.dumps(writer.tree(obj), separators=(",", ":"))
    header: dict[str, Any] = {"__metadata__": {"format": FORMAT, "tree": tree}}
    offset = 0
    for i, data in enumerate(writer.raw):
        header[str(i)] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the bytes that follow
    if len(text) > MAX_HEADER:
        raise ValueError(f"the returned values' structure takes {len(text) // 1024} KiB; "
                         f"the limit is {MAX_HEADER // 1024} KiB")
    return b"".join([struct.pack("<Q", len(text)), text, *writer.raw])


def _header(data: bytes) -> tuple[str, int]:
    """The record's tree (JSON text) and its number of tensor entries, from a header whose
    size is checked before it is parsed."""
    if len(data) < 8:
        raise ChannelError("the returned values are not a channel record (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        raise ChannelError(f"the returned values' header claims {n} bytes; the limit is {MAX_HEADER}")
    if n > len(data) - 8:
        raise ChannelError("the returned values' header is cut short")
    raw = data[8:8 + n]
    if raw.count(b"{") + raw.count(b"[") > 2 * MAX_NODES:
        raise ChannelError(f"the returned values hold more than {MAX_NODES} items")
    try:
        header = json.loads(raw)
        meta = header["__metadata__"]
        if type(meta) is not dict or meta.get("format") != FORMAT or type(meta.get("tree")) is not str:
            raise ValueError("not this format")
    except (ValueError, TypeError, KeyError, RecursionError):
        raise ChannelError("the returned values are not a channel record (a malformed header)") from None
    return meta["tree"], len(header) - 1


def decode(data: bytes) -> Any:
    """Parent side: the validated value of one record; :class:`ChannelError` on anything odd."""
    if message := too_big(len(data)):
        raise ChannelError(message)
    tree, entries = _header(data)
    if tree.count("{") + tree.count("[") > MAX_NODES:
        raise ChannelError(f"the returned values hold more than {MAX_NODES} items")
    try:
        flat = deserialize(data) if entries else []
    except (SafetensorError, ValueError, TypeError, OverflowError) as e:
        raise ChannelError(f"the returned values' bytes do not match their header ({str(e)[:100]})") from None
    raw: dict[str, bytes] = {}
    for name, info in flat:
        if info.get("dtype") not in ("U8", "u8", "uint8") or len(info.get("shape", ())) != 1:
            raise ChannelError("a tensor entry of the returned values is not raw bytes")
        raw[name] = info["data"]
    try:
        value = json.loads(tree)
    except (ValueError, RecursionError):
        raise ChannelError("the returned values are not a channel record (a malformed tree)") from None
    return _build(value, raw, 0, [MAX_NODES, MAX_CHARS])


def _tensor(node: dict, raw: dict[str, bytes]) -> torch.Tensor:
    index, name, shape = node.get("x"), node.get("dtype"), node.get("shape")
    dtype = _DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise ChannelError(f"tensor dtype {str(name)[:40]!r} is not allowed")
    if (type(shape) is not list or len(shape) > 64
            or any(type(n) is not int or not 0 <= n < 2**40 for n in shape)):
        raise ChannelError("a returned tensor has a malformed shape")
    data = raw.pop(str(index), None) if type(index) is int else None
    if data is None:  # popped: the same bytes cannot make two tensors
        raise ChannelError("a returned tensor's bytes are missing or shared")
    if math.prod(shape) * _SIZES[name] != len(data):
        raise ChannelError("a returned tensor's bytes do not match its shape")
    if not data:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype == torch.bool:
        return (flat != 0).reshape(shape)  # any byte but 0 is True: no invalid bools
    return flat.view(dtype).reshape(shape)


def _build(x: Any, raw: dict[str, bytes], depth: int, budget: list[int]) -> Any:
    """The value of tree node ``x``; :class:`ChannelError` on anything not plain.
    ``budget``: how many more values and characters may be built ([values, characters])."""
    if depth > MAX_DEPTH:
        raise ChannelError(f"the returned values nest deeper than {MAX_DEPTH} levels")
    budget[0] -= 1
    if budget[0] < 0:
        raise ChannelError(f"the returned values hold more than {MAX_NODES} items")
    if type(x) is int and not -MAX_INT < x < MAX_INT:
        raise ChannelError("a returned integer is beyond 64 bits")
    if x is None or type(x) in (bool, int, float):
        return x
    if type(x) is str:
        budget[1] -= len(x)
        if budget[1] < 0:
            raise ChannelError(f"the returned values hold more than {MAX_CHARS} characters of text")
        return x if len(x) <= MAX_STRING else x[:MAX_STRING] + " [truncated]"
    if type(x) is list:
        return [_build(v, raw, depth + 1, budget) for v in x]
    if type(x) is dict and len(x) == 1 and type(x.get("t")) is list:
        return tuple(_build(v, raw, depth + 1, budget) for v in x["t"])
    if type(x) is dict and len(x) == 1 and type(x.get("c")) is list and len(x["c"]) == 2 \
            and all(type(v) in (int, float) for v in x["c"]):
        return complex(*x["c"])
    if type(x) is dict and len(x) == 1 and type(x.get("d")) is list:
        out = {}
        for pair in x["d"]:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int):
                raise ChannelError("a returned dict's item is not a (str or int key, value) pair")
            key = _build(pair[0], raw, depth + 1, budget)
            out[key] = _build(pair[1], raw, depth + 1, budget)
        return out
    if type(x) is dict and set(x) == {"x", "dtype", "shape"}:
        return _tensor(x, raw)
    raise ChannelError("a returned value is not plain data")


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
        "error": None if o.error is None else o.error[:MAX_ERROR],
        "devices": _encode(o.devices),
        "args_after": _encode(o.args_after),
        "grads": _encode(o.grads),
        "seconds": float(o.seconds),
        "cpu": float(o.cpu),
        "where": getattr(o, "where", None),
        "largest": o.largest,
        "peak": o.peak,
    }


def outcome_from_data(d: Any) -> Outcome:
    """Rebuild an :class:`Outcome` from validated data, checking each field's type."""
    if type(d) is not dict:
        raise ChannelError("a call's record is not a dict")
    error = d.get("error")
    if error is not None and type(error) is not str:
        raise ChannelError("a call's error is not a string")
    seconds, cpu = d.get("seconds", 0.0), d.get("cpu", 0.0)
    for t in (seconds, cpu):
        if type(t) not in (int, float) or not 0 <= t < 1e6:  # NaN fails the comparison too
            raise ChannelError("a call's time is not a number of seconds")
    args_after = d.get("args_after")
    if args_after is not None and type(args_after) not in (tuple, list):
        raise ChannelError("a call's arguments-after record is not a sequence")
    where = d.get("where")
    largest = d.get("largest")
    if largest is not None and (type(largest) not in (tuple, list) or len(largest) > 64
                                or any(type(n) is not int or n < 0 for n in largest)):
        raise ChannelError("a call's record of its largest tensor is not a shape")
    peak = d.get("peak")
    if peak is not None and (type(peak) is not int or not 0 <= peak < 2**63):
        raise ChannelError("a call's record of its live tensors is not a count")
    return Outcome(
        output=_decode(d.get("output")),
        error=None if error is None else error[:MAX_ERROR],
        devices=_decode(d.get("devices")),
        args_after=None if args_after is None else tuple(_decode(args_after)),
        grads=_decode(d.get("grads")),
        seconds=float(seconds),
        cpu=float(cpu),
        where=where[:300] if type(where) is str else None,
        largest=None if largest is None else tuple(largest),
        peak=peak,
    )


def loaded_from_data(d: Any, names: int = 64, errors: int = 50) -> dict:
    """The loaded record (``{"found": {name: where}, "errors": [text]}``), checked and cut:
    at most ``names`` names and ``errors`` errors, each a short string."""
    if type(d) is not dict or type(d.get("found")) is not dict or type(d.get("errors", [])) is not list:
        raise ChannelError("the loaded record is not {found: dict, errors: list}")
    found = {k[:100]: v[:300] for k, v in list(d["found"].items())[:names]
             if type(k) is str and type(v) is str}
    return {"found": found, "errors": [e[:500] for e in d.get("errors", [])[:errors] if type(e) is str]}
