"""Plain data from the worker to the trusted process, and nothing else.

The worker writes with ``torch.save``; the parent reads with
``torch.load(weights_only=True)`` (no code runs while unpickling) and then
re-validates every value with :func:`plain`: only ``type(t) is torch.Tensor``
(strided, on the CPU), numbers, strings, None, and tuples/lists/dicts of them
pass. Anything else -- a tensor subclass, a forged object, a file too big --
becomes a :class:`ChannelError` with a plain message, which fails the check it
belongs to. Student code can write whatever it likes into these files: the
worst it can forge is its own function's return value.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .spec import NotATensor, Outcome

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 32
MAX_STRING = 100_000
_NOT_A_TENSOR = "__not_a_tensor__"


class ChannelError(Exception):
    """What came back from the worker is not plain data."""


def send(obj: Any, path: str) -> None:
    """Worker side: write ``obj`` atomically (readers never see half a file)."""
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def receive(path: str) -> Any:
    """Parent side: load and validate ``path``; raise :class:`ChannelError` on anything odd."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise ChannelError("the worker wrote no result") from None
    if size > MAX_FILE_BYTES:
        raise ChannelError(f"the returned values take {size // 2**20} MiB; "
                           f"the limit is {MAX_FILE_BYTES // 2**20} MiB")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any unpickling failure means "not plain data"
        raise ChannelError(f"the returned values are not plain data ({type(e).__name__})") from None
    return plain(data)


def plain(x: Any, depth: int = 0) -> Any:
    """A validated copy of ``x``; raises :class:`ChannelError` on anything not plain."""
    if depth > MAX_DEPTH:
        raise ChannelError(f"the returned values nest deeper than {MAX_DEPTH} levels")
    if x is None or type(x) in (bool, int, float, complex):
        return x
    if type(x) is str:
        if len(x) > MAX_STRING:
            return x[:MAX_STRING] + " [truncated]"
        return x
    if type(x) is torch.Tensor:
        if x.layout != torch.strided or x.is_quantized or x.device.type != "cpu":
            raise ChannelError(f"a returned tensor has layout {x.layout} on {x.device}; "
                               "only dense CPU tensors come back")
        return x.detach()
    if type(x) in (tuple, list):
        items = [plain(v, depth + 1) for v in x]
        return tuple(items) if type(x) is tuple else items
    if type(x) is dict:
        out = {}
        for k, v in x.items():
            if type(k) not in (str, int):
                raise ChannelError(f"a dict key of type {type(k).__name__} came back")
            out[k] = plain(v, depth + 1)
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
    }


def outcome_from_data(d: Any) -> Outcome:
    """Rebuild an :class:`Outcome` from validated data, checking each field's type."""
    if type(d) is not dict:
        raise ChannelError("a call's record is not a dict")
    error = d.get("error")
    if error is not None and type(error) is not str:
        raise ChannelError("a call's error is not a string")
    seconds = d.get("seconds", 0.0)
    if type(seconds) not in (int, float):
        raise ChannelError("a call's time is not a number")
    args_after = d.get("args_after")
    if args_after is not None and type(args_after) not in (tuple, list):
        raise ChannelError("a call's arguments-after record is not a sequence")
    where = d.get("where")
    return Outcome(
        output=_decode(d.get("output")),
        error=error,
        devices=_decode(d.get("devices")),
        args_after=None if args_after is None else tuple(_decode(args_after)),
        grads=_decode(d.get("grads")),
        seconds=float(seconds),
        where=where if type(where) is str else None,
    )
