"""Grader fixture, appended to tests/submissions/correct.py by tests/test_hidden_channel.py
(alone it defines no exercise): a submission that tries to carry the hidden cases out
through the feedback. Every graded function prints its inputs and, by its place in the
course, always fails the same way whatever the case: it raises a ValueError that quotes
its arguments and every case the worker holds (the hidden ones among them, read while a
public check runs), raises a class of its own named after their shapes, raises one of 16
builtin exception types chosen by its inputs (4 bits of the case per check), returns its answer
with an extra leading dimension as long as the first input, or returns wrong values
that encode its inputs. While it loads, one statement raises an exception that quotes
what it finds in every frame above it (the worker's job, with the hidden cases).
Graded under two seeds, its feedback must be the same, on hidden checks and public ones.
"""

import functools as _functools
import sys as _sys

import torch as _torch


def _shapes(args):
    return "x".join("_".join(map(str, a.shape)) for a in args if isinstance(a, _torch.Tensor)) or "none"


def _size(args):
    return sum(a.numel() if isinstance(a, _torch.Tensor) else a if isinstance(a, int) else 0 for a in args)


def _cases():
    """The args of every call of the exercise's checks, from the worker's frames above."""
    out, frame = [], _sys._getframe()
    while frame is not None:
        for check in frame.f_locals.get("checks", None) or []:
            out += [repr(call.args)[:60] for call in getattr(check, "calls", [])]
        frame = frame.f_back
    return out


def _wrong(out, args):
    if isinstance(out, tuple | list):
        return type(out)(_wrong(o, args) for o in out)
    if not isinstance(out, _torch.Tensor) or out.device.type == "meta":
        return out
    if out.dtype == _torch.bool:
        return ~out
    return out + 1 + _size(args) % 97


_TYPES = (ValueError, TypeError, KeyError, IndexError, RuntimeError, ZeroDivisionError, AttributeError,
          LookupError, ArithmeticError, OverflowError, AssertionError, NotImplementedError, OSError,
          MemoryError, UnicodeError, BufferError)


def _leaky(f, how):
    @_functools.wraps(f)
    def g(*args, **kwargs):
        print("INPUTS", args, kwargs)
        if how == 0:
            raise ValueError(f"INPUTS {args!r} {kwargs!r} {_cases()}")
        if how == 1:
            raise type(f"E_{_shapes(args)}_{_size(args)}", (Exception,), {})(f"INPUTS {args!r}")
        if how == 4:
            raise _TYPES[_size(args) % 16]("")
        out = f(*args, **kwargs)
        if how == 2 and isinstance(out, _torch.Tensor):
            return out.expand(_size(args) % 7 + 2, *out.shape)
        return _wrong(out, args)
    return g


if True:
    _graded = [n for n, f in list(globals().items())
               if callable(f) and getattr(f, "__module__", None) == __name__ and not n.startswith("_")]
    for _i, _name in enumerate(_graded):
        globals()[_name] = _leaky(globals()[_name], _i % 5)


def _frames():
    out, frame = [], _sys._getframe()
    while frame is not None:
        out.append(repr(frame.f_locals)[:5000])
        frame = frame.f_back
    return " | ".join(out)


if True:
    raise RuntimeError("LOAD " + _frames())
