"""Make one :class:`~grader.spec.Call` to a function and record an :class:`Outcome`.

Used inside the sandboxed worker (CLI grading) and in the student's kernel (the
in-notebook ``check``). Everything recorded is plain data: judges in the
trusted process never touch the student's objects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sysconfig
import time
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..spec import Call, FnSpec, NotATensor, Outcome


def reseed(seed: int) -> None:
    """torch's generators back to ``seed`` before a call, so randomness in student code repeats.

    ``torch.manual_seed`` also queues a CUDA (and XPU, MTIA) seeding with a formatted
    stack trace while those are not initialised -- on every call, a third of a
    grading's time and a list that only grows. Their default seeds are fixed
    already, so only a device that is in use is reseeded.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


class ExerciseTimeout(BaseException):
    """The exercise's time is up. BaseException: ``except Exception`` in student code won't eat it."""


def _alarm(signum, frame):
    raise ExerciseTimeout()


def execute_limited(fn, call: Call, *, want_grads: bool, seconds: float, timed_out: str) -> Outcome:
    """:func:`execute` stopped after ``seconds`` by SIGALRM (main thread only), with ``timed_out`` as error.

    A one-shot timer (``setitimer``) interrupts Python loops and ``time.sleep`` alike and
    costs nothing when the call is quick. The worker and the notebook's ``check`` both use
    it; the SIGALRM handler and the timer that were there before are put back afterwards.
    """
    previous = signal.signal(signal.SIGALRM, _alarm)
    earlier = signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        try:
            outcome = execute(fn, call, want_grads=want_grads)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ExerciseTimeout:  # it fired after fn returned, while its result was being recorded
        outcome = Outcome(error="ExerciseTimeout: ")
    except BaseException as e:  # noqa: BLE001 -- e.g. RecursionError converting a self-referencing list
        outcome = Outcome(error=f"GraderError: the grader could not record what came back "
                                f"({type(e).__name__}: {e})")
    finally:  # the timer is off: nothing can interrupt this any more
        signal.signal(signal.SIGALRM, previous)
        if earlier[0]:
            signal.setitimer(signal.ITIMER_REAL, *earlier)
    if outcome.error and outcome.error.startswith("ExerciseTimeout"):
        outcome.error = timed_out
    return outcome


def _to_device(x: Any, device: str) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone().to(device)
    if isinstance(x, FnSpec):
        from ..fnspecs import build

        return build(x, device)
    if isinstance(x, tuple):
        return tuple(_to_device(v, device) for v in x)
    if isinstance(x, list):
        return [_to_device(v, device) for v in x]
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


def to_plain(x: Any) -> tuple[Any, Any]:
    """Return value -> (plain data, device structure). Meta tensors become zeros
    of the same shape and dtype (their device is recorded as "meta")."""
    if type(x) is torch.Tensor:
        dev = x.device.type
        t = x.detach()
        t = torch.zeros(t.shape, dtype=t.dtype) if dev == "meta" else t.cpu().clone()
        return t, dev
    if isinstance(x, torch.Tensor):
        return NotATensor(f"tensor subclass {type(x).__name__}"), None
    if x is None or type(x) in (bool, int):  # an answer (an index, yes or no): plain data as it is
        return x, None
    if isinstance(x, tuple | list):
        pairs = [to_plain(v) for v in x]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    return NotATensor(type(x).__name__), None


def _grad_probe(args: tuple) -> tuple[tuple, list[int]]:
    """Copies of the float tensor args that require grad; their positions."""
    out, idx = [], []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            a = a.detach().clone().requires_grad_(True)
            idx.append(i)
        out.append(a)
    return tuple(out), idx


class Allocations(TorchDispatchMode):
    """Records, while active, the shape of the largest floating tensor any operation creates
    (:attr:`largest`) and the most floating entries that the operations' results held alive at
    once (:attr:`peak`: what is alive at once, not what was made).

    Every tensor operation passes through ``__torch_dispatch__`` below autograd, so
    ``q @ k.mT``, ``torch.zeros``, ``.float()`` and a copy are all seen, whatever Python
    code called them, and so is the backward that ``torch.autograd.grad`` runs. An operation
    whose result aliases an input (a view such as ``expand`` or a slice, an in-place op)
    allocates nothing new and is not counted. A result's storage counts from its creation
    until that storage is freed (a finalizer on it), so the weights autograd keeps for its
    backward count for as long as it keeps them. Work done outside torch (numpy) or on another
    thread is not seen: the record holds ordinary code to a rule, and is no defence against
    code written to dodge it.
    """

    def __init__(self):
        super().__init__()
        self.largest: tuple[int, ...] = ()
        self._numel = 0
        self.peak = 0  # entries
        self._now = 0
        self._live: dict[int, int] = {}  # id of a live storage -> its floating entries

    def _freed(self, key: int) -> None:
        self._now -= self._live.pop(key, 0)

    def _created(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        entries = storage.nbytes() // max(t.element_size(), 1)
        self._live[key] = entries
        self._now += entries
        self.peak = max(self.peak, self._now)
        weakref.finalize(storage, self._freed, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = getattr(func, "_schema", None)
        if schema is None or not any(r.alias_info is not None for r in schema.returns):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                    if t.numel() > self._numel:
                        self._numel, self.largest = t.numel(), tuple(int(n) for n in t.shape)
                    self._created(t)
        return out


def execute(fn, call: Call, *, want_grads: bool = False) -> Outcome:
    """Run ``fn`` on ``call`` (args moved to ``call.device``) and record what happened."""
    t0, c0 = time.perf_counter(), time.process_time()
    args = _to_device(call.args, call.device)
    kwargs = _to_device(call.kwargs, call.device)
    grad_idx: list[int] = []
    if want_grads:
        args, grad_idx = _grad_probe(args)
    before = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args)
    requires = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    watch = Allocations() if call.allocations else None
    default = torch.device(call.default_device) if call.default_device else contextlib.nullcontext()
    try:
        with default:
            if watch is None:
                result = fn(*args, **kwargs)
            else:
                with watch:
                    result = fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 -- a student's SystemExit is an outcome too
        return Outcome(error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0,
                       cpu=time.process_time() - c0, where=_where(e.__traceback__))
    output, devices = to_plain(result)
    grads = None
    if want_grads and watch is not None:
        with watch:  # the record then holds the backward too: what autograd saved, and what it makes
            grads = _grads(result, args, grad_idx)
    elif want_grads:
        grads = _grads(result, args, grad_idx)
    args_after = tuple(
        None if b is None else _after(a, b, r) for a, b, r in zip(args, before, requires)
    )
    return Outcome(output=output, devices=devices, args_after=args_after, grads=grads,
                   seconds=time.perf_counter() - t0, cpu=time.process_time() - c0,
                   largest=None if watch is None else watch.largest,
                   peak=None if watch is None else watch.peak)


# Frames in these folders are library code; the innermost frame elsewhere is the student's.
_LIBRARY_DIRS = tuple(
    os.path.dirname(p) + os.sep
    for p in (torch.__file__, os.path.dirname(__file__))  # torch/, grader/
) + tuple(d + os.sep for d in {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib")} if d)


def _where(tb) -> str | None:
    """"line N of <file>" for the innermost frame of the traceback in the student's code."""
    where = None
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<frozen"):
            where = f"line {tb.tb_lineno} of {name.strip('<>')}"
        tb = tb.tb_next
    return where


def _after(a: torch.Tensor, before: torch.Tensor, requires_grad: bool = False) -> Any:
    """The arg after the call, as plain data, plus whether its autograd state changed."""
    data, _ = to_plain(a.detach())
    return {"value": data, "grad_set": a.grad is not None,
            "requires_grad_changed": a.requires_grad != requires_grad}


def _grads(result: Any, args: tuple, grad_idx: list[int]) -> Any:
    """Gradients of a fixed weighted sum of the float outputs w.r.t. the float args."""
    outs = [r for r in (result if isinstance(result, tuple | list) else (result,))
            if type(r) is torch.Tensor and r.dtype.is_floating_point and r.requires_grad]
    if not outs:
        return {"error": "no output depends differentiably on the inputs"}
    try:
        gen = torch.Generator().manual_seed(1234)
        total = sum((o.float() * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs)
        gs = torch.autograd.grad(total, [args[i] for i in grad_idx], allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    return {i: (None if g is None else to_plain(g)[0]) for i, g in zip(grad_idx, gs)}
