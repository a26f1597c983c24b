"""torch's heaviest modules, imported only when something really needs them.

Student code runs on the ``meta`` device in some checks (a tensor it builds on the
wrong device then fails loudly). torch's meta kernels, on first use, import two
large modules only to ask them trivial questions: ``torch._dynamo`` (to learn that
nothing is being compiled) and ``torch.fx.experimental.symbolic_shapes``, which
imports sympy (to ask whether ``True`` is true); type promotion imports sympy too,
to ask whether an argument is a sympy expression. Together they are most of a
worker's start after torch itself. Here each is a stand-in that answers those
questions for the plain ints and bools of eager code exactly as the real module
does, and imports the real module for anything else: any other name, and any
symbolic value (so ``torch.compile`` in student code still works).
"""

from __future__ import annotations

import functools
import importlib
import operator
import sys
import types

DYNAMO = "torch._dynamo"
SHAPES = "torch.fx.experimental.symbolic_shapes"
SYMPY = "sympy"


class _Deferred(types.ModuleType):
    """A stand-in for a module: any name it does not define imports the real one."""

    package = True  # the real one has submodules: the import system may ask for its __path__

    def _real(self) -> types.ModuleType:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return importlib.import_module(self.__name__)

    def __getattr__(self, name: str):
        if name == "__path__" and not self.package:  # what the import system asks a plain module
            raise AttributeError(name)
        return getattr(self._real(), name)


class _Dynamo(_Deferred):
    """Stands in for ``torch._dynamo`` until something really needs it.

    torch's Python meta kernels (the ``meta`` device, which the checks use) wrap
    themselves in ``torch._dynamo.disable`` on first use, importing all of dynamo
    (about a second) only to learn that nothing is being compiled. Here
    ``disable`` is the identity; any other attribute imports the real module
    (so ``torch.compile`` in student code still works).
    """

    def disable(self, fn=None, recursive=True, **kwargs):
        return fn if fn is not None else (lambda f: f)


def _plain(*values) -> bool:
    """Whether every value is a plain int or bool (eager code's sizes), none symbolic."""
    return all(type(v) in (int, bool) for v in values)


def _plain_sizes(v) -> bool:
    return _plain(v) or (isinstance(v, tuple | list) and all(_plain_sizes(e) for e in v))


def _concrete(v) -> bool:
    """Whether ``v`` holds no symbolic value anywhere: plain scalars, containers of them,
    and strided tensors with plain sizes, strides and offset (as on the meta device)."""
    import torch

    if v is None or type(v) in (int, float, bool, str):
        return True
    if isinstance(v, tuple | list):
        return all(_concrete(e) for e in v)
    if isinstance(v, dict):
        return all(_concrete(k) and _concrete(e) for k, e in v.items())
    if isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_nested:
        return _plain(*v.size(), *v.stride(), v.storage_offset())
    return False


class _Shapes(_Deferred):
    """Stands in for ``torch.fx.experimental.symbolic_shapes`` (and sympy behind it):
    the questions the meta kernels ask, answered for plain values as the real
    functions answer them (a bool is itself; a plain int has a hint, no nesting)."""

    package = False

    def guard_size_oblivious(self, a):
        return a if type(a) is bool else self._real().guard_size_oblivious(a)

    def guard_or_false(self, a):
        return a if type(a) is bool else self._real().guard_or_false(a)

    def statically_known_true(self, a):
        return a if type(a) is bool else self._real().statically_known_true(a)

    def guard_int(self, a):
        return a if type(a) is int else self._real().guard_int(a)

    def optimization_hint(self, a, fallback=None):
        return a if type(a) is int else self._real().optimization_hint(a, fallback)

    def has_free_symbols(self, val):
        return False if _concrete(val) else self._real().has_free_symbols(val)

    def free_unbacked_symbols(self, x):
        if _concrete(x):
            from torch.utils._ordered_set import OrderedSet

            return OrderedSet()
        return self._real().free_unbacked_symbols(x)

    def guard_or_true(self, a):
        return a if type(a) is bool else self._real().guard_or_true(a)

    def expect_true(self, a, skip: int = 0):
        return a if type(a) is bool else self._real().expect_true(a, skip + 1)

    def guarding_hint_or_throw(self, a):
        return a if _plain(a) else self._real().guarding_hint_or_throw(a)

    def has_guarding_hint(self, a):
        return True if type(a) in (int, bool, float) else self._real().has_guarding_hint(a)

    def is_nested_int(self, s):
        return False if type(s) in (int, bool, float) else self._real().is_nested_int(s)

    def sym_and(self, x, *others):
        if _plain(x, *others):
            return functools.reduce(operator.and_, others, x)
        return self._real().sym_and(x, *others)

    def sym_or(self, x, *others):
        if _plain(x, *others):
            return functools.reduce(operator.or_, others, x)
        return self._real().sym_or(x, *others)

    def sym_eq(self, x, y):
        if not (_plain_sizes(x) and _plain_sizes(y)):
            return self._real().sym_eq(x, y)
        if isinstance(x, tuple | list) and isinstance(y, tuple | list):
            return len(x) == len(y) and functools.reduce(operator.and_, map(self.sym_eq, x, y), True)
        if isinstance(x, tuple | list) or isinstance(y, tuple | list):
            return self._real().sym_eq(x, y)  # the real one says what is wrong
        return x == y


class _Sympy(_Deferred):
    """Stands in for sympy until something uses it: until then no sympy expression
    can exist, so none is an instance of ``Basic``; once the real sympy is loaded,
    ``Basic`` is its own."""

    class _NoneYet:
        """Nothing is an instance of this."""

    def __getattr__(self, name: str):
        if name == "Basic" and sys.modules.get(self.__name__) is self:
            return self._NoneYet
        return super().__getattr__(name)


def install() -> list[str]:
    """Put the stand-ins in place of modules not imported yet (the worker, before any student
    code); returns the names it stood in for (see :func:`uninstall`)."""
    placed = []
    for name, stand_in in ((DYNAMO, _Dynamo), (SHAPES, _Shapes), (SYMPY, _Sympy)):
        if name not in sys.modules:
            sys.modules[name] = stand_in(name)
            placed.append(name)
    return placed


def uninstall(names: list[str]) -> None:
    """Take out the stand-ins of ``names`` still in place (a real import may have replaced one)."""
    for name in names:
        if isinstance(sys.modules.get(name), _Deferred):
            del sys.modules[name]
