"""Grader fixture, appended to tests/submissions/correct.py (alone it defines no exercise): a
submission that tries to carry the hidden cases out through how each hidden check fails.

Every graded function looks at its inputs and picks one of six behaviours by a property of
them (their total size): answer right, answer wrong by a value, answer with an extra
dimension, raise ValueError, raise NotImplementedError, call an API the course forbids. Each
behaviour once gave a hidden check words of its own (log2 6 = 2.6 bits per hidden check); a
grading with the instructor's seed must say pass or fail and nothing more
(scripts/bench_hidden_bits.py measures it).

At load it also looks, through the garbage collector, for every object of the grader's job
that holds calls (the hidden cases among them) and prints how many it found ("CALLS n"):
the calls reach the worker only after the submission has loaded.
"""

import functools as _functools
import gc as _gc

import torch as _torch


def _size(args):
    return sum(a.numel() if isinstance(a, _torch.Tensor) else a if isinstance(a, int) else 0 for a in args)


def _calls_in_reach():
    return sum(1 for o in _gc.get_objects()
               if type(o).__module__.startswith("grader.") and type(o).__name__ in ("CheckJob", "Call"))


CALLS = _calls_in_reach()
_ = print("CALLS", CALLS, flush=True)


def _choose(f):
    @_functools.wraps(f)
    def g(*args, **kwargs):
        how = _size(args) % 6
        if how == 3:
            raise ValueError("chosen")
        if how == 4:
            raise NotImplementedError
        if how == 5:
            return _torch.nn.functional.scaled_dot_product_attention(*args[:3])
        out = f(*args, **kwargs)
        if how == 1 and isinstance(out, _torch.Tensor) and out.dtype != _torch.bool:
            return out + 1
        if how == 1 and isinstance(out, _torch.Tensor):
            return ~out
        if how == 2 and isinstance(out, _torch.Tensor):
            return out.expand(2, *out.shape)
        return out
    return g


if True:
    _graded = [n for n, f in list(globals().items())
               if callable(f) and getattr(f, "__module__", None) == __name__ and not n.startswith("_")]
    for _name in _graded:
        globals()[_name] = _choose(globals()[_name])
