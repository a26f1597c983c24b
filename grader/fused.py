"""PyTorch's fused attention kernels, blocked where they run: in its dispatcher.

The rule (:mod:`grader.rules`) forbids the functions that would be the answer.
Replacing ``F.scaled_dot_product_attention`` by a stand-in stops the name, not
the kernel: ``torch.ops.aten.scaled_dot_product_attention``, the kernels under it
(``_scaled_dot_product_flash_attention_for_cpu``, ``_scaled_dot_product_attention_math``,
``_efficient_attention_forward``, ...), the real function kept in a stand-in's
closure or compiled under a file name of the grader's all reach the same
operators. :func:`blocked` registers, for every such operator the dispatcher
knows and at every dispatch key it has a kernel for, a kernel that raises the
rule; and the flex attention higher-order operators raise it when called. Who
calls, and by what name, no longer matters: the operator runs or it does not.
``aten::_safe_softmax`` is one of them: softmax that gives a fully masked row zeros
is the masked-softmax exercise in one call, and FlexAttention's eager
``math_attention`` (and SDPA's math path) end in it.

Some of PyTorch's attention is Python over plain operators (``bmm``, ``softmax``),
which no operator-level rule can tell from a student's own code: the quantizable
``MultiheadAttention`` is one. Each is a subclass of ``torch.nn.MultiheadAttention``,
so :func:`subclasses_blocked` refuses the class and every class under it, by what it
is, not by its name: every function each of them defines raises the rule.

Imports torch: the worker and the notebook's ``check`` use it, the parent never.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

#: Fragments of the names of the operators that are attention (or masked softmax) in one kernel.
FUSED = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention",
         "multi_head_attention", "masked_softmax", "safe_softmax", "transformer_encoder_layer",
         "flex_attention")
_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
         "CPU", "CUDA", "Meta", "MPS", "XPU", "HPU", "PrivateUse1", "QuantizedCPU", "QuantizedCUDA",
         "NestedTensorCPU", "NestedTensorCUDA", "NestedTensorMeta", "SparseCPU", "SparseCUDA")


def fused_operators() -> list[str]:
    """``aten::`` operators (with overloads) that compute attention, or a masked softmax, in one kernel;
    backward ones left out (they run only after a forward one did)."""
    return sorted(name for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("aten::") and "backward" not in name and any(f in name for f in FUSED))


def _hops() -> list[type]:
    """The classes of the higher-order operators of flex attention (imported with torch)."""
    from torch._ops import HigherOrderOperator

    found = []
    for module in ("torch._higher_order_ops.flex_attention",):
        try:
            mod = __import__(module, fromlist=["_"])
        except ImportError:
            continue
        found += [obj for obj in vars(mod).values() if isinstance(obj, type)
                  and issubclass(obj, HigherOrderOperator) and obj is not HigherOrderOperator]
    return found


@contextmanager
def blocked(refuse: Callable[[str], BaseException]) -> Iterator[list[str]]:
    """While the block runs, every fused attention operator raises ``refuse(operator name)``.
    Yields the operators blocked. On exit the dispatcher's own kernels are back."""
    lib = torch.library.Library("aten", "IMPL")

    def refusing(name: str):
        def refused(*args, **kwargs):  # a kernel, or a method (self is the first of args)
            raise refuse(name)

        return refused

    names, saved = [], []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": on purpose
            for qualified in fused_operators():
                op = qualified.split("::", 1)[1]
                for key in _KEYS:
                    if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
                        lib.impl(op, refusing(qualified), key)
                        names.append(qualified)
        for cls in _hops():
            saved.append((cls, cls.__dict__.get("__call__")))
            cls.__call__ = refusing(cls.__name__)
            names.append(cls.__name__)
        yield sorted(set(names))
    finally:
        for cls, call in saved:
            if call is None:
                del cls.__call__
            else:
                cls.__call__ = call
        lib._destroy()


#: The libraries of refusing kernels registered for good (:func:`block_for_good`): a library
#: that is collected takes its kernels with it. They hold the refusals only, no original.
_KEPT: list = []


def block_for_good(refuse: Callable[[str], BaseException]) -> list[str]:
    """:func:`blocked` for the rest of the process, keeping nothing to restore: no original
    (a higher-order operator's ``__call__``) stays reachable, from a saved list, a generator's
    frame or ``gc.get_referrers``. For the sandbox's worker, which never needs them back."""
    lib = torch.library.Library("aten", "IMPL")
    _KEPT.append(lib)

    def refusing(name: str):
        def refused(*args, **kwargs):
            raise refuse(name)

        return refused

    names = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for qualified in fused_operators():
            op = qualified.split("::", 1)[1]
            for key in _KEYS:
                if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
                    lib.impl(op, refusing(qualified), key)
                    names.append(qualified)
    for cls in _hops():
        cls.__call__ = refusing(cls.__name__)
        names.append(cls.__name__)
    return sorted(set(names))


def refuse_subclasses_for_good(base: type, refuse: Callable[[], BaseException]) -> list[type]:
    """:func:`subclasses_blocked` for the rest of the process, keeping no original function."""

    def refused(*args, **kwargs):
        raise refuse()

    classes = _all_subclasses(base)
    for cls in classes:
        for name, value in list(vars(cls).items()):
            code = callable(value) or isinstance(value, classmethod | staticmethod)
            if code and name not in _MACHINERY and not isinstance(value, type):
                setattr(cls, name, refused)
    return classes


#: Attributes of a class that are the class machinery, not what its instances compute.
_MACHINERY = ("__new__", "__init_subclass__", "__subclasshook__", "__class_getitem__")


def _all_subclasses(base: type) -> list[type]:
    found, stack = [], [base]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.append(cls)
            stack += cls.__subclasses__()
    return found


@contextmanager
def subclasses_blocked(base: type, refuse: Callable[[], BaseException]) -> Iterator[list[type]]:
    """While the block runs, every function defined by ``base`` or a class under it (its
    ``__init__``, ``forward``, helpers, class methods) raises ``refuse()``; a class defined later
    under ``base`` inherits the refusing ``__init__``. Yields the classes; restores them on exit."""

    def refused(*args, **kwargs):
        raise refuse()

    saved = []
    classes = _all_subclasses(base)
    try:
        for cls in classes:
            for name, value in list(vars(cls).items()):
                code = callable(value) or isinstance(value, classmethod | staticmethod)
                if code and name not in _MACHINERY and not isinstance(value, type):
                    saved.append((cls, name, value))
                    setattr(cls, name, refused)
        yield classes
    finally:
        for cls, name, value in reversed(saved):
            setattr(cls, name, value)
