"""The rules students see: inside an exercise, the answer may not be borrowed.

Off limits: the course package ``attnmask`` (it *is* the reference), PyTorch's
fused attention ``torch.nn.functional.scaled_dot_product_attention`` (and its
``enable_gqa=`` switch), ``torch.nn.MultiheadAttention`` /
``multi_head_attention_forward``, ``flex_attention`` and transformers'
``build_alibi_tensor``.

Three layers enforce this, each cheap:

* :func:`scan_cells` reads the submission's source (never runs it) and says which
  exercise reaches a forbidden name, directly or through a helper function.
* :func:`block_imports` (worker only) makes ``import attnmask`` fail with the rule.
* :func:`forbid_torch_apis` replaces the torch callables by functions that raise
  :class:`ForbiddenAPIError`, so a check that hits one fails with the rule, and
  blocks the fused attention operators themselves in PyTorch's dispatcher
  (:mod:`grader.fused`): ``torch.ops.aten``, the kernels under SDPA, flex
  attention's operators, the real function kept in a stand-in or called from
  code compiled under a grader file name all end there. The stand-ins hold no
  reference to what they replace, and nothing is let through by its caller's
  file name.
"""

from __future__ import annotations

import ast
import importlib.abc
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

RULE = "is off limits in exercises: it would be the answer"

#: Modules a submission may not import at all in the grader.
FORBIDDEN_MODULES = ("attnmask", "torch.nn.attention.flex_attention")
#: Grader internals a submission has no business importing (they hold the reference).
PRIVATE_MODULES = ("grader.checks", "grader.diagnose", "grader.engine")
#: Names whose mere use in an exercise is reported by the static scan.
FORBIDDEN_NAMES = (
    "scaled_dot_product_attention",
    "MultiheadAttention",
    "multi_head_attention_forward",
    "flex_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward",
    "_flash_attention_forward",
    "_native_multi_head_attention",
    # grouped-query attention and ALiBi (chapter 9): SDPA's GQA switch (also caught
    # as a keyword argument) and the transformers helper that builds the bias
    "enable_gqa",
    "build_alibi_tensor",
)
#: What the rule names when a fused attention operator ran, whatever called it (one wording: feedback
#: on hidden checks shows only the rule's own words).
FUSED_KERNEL = ("a fused attention kernel of PyTorch (scaled_dot_product_attention or an operator under it, "
                "flex attention, fused or safe masked softmax)")
#: What the rule names when PyTorch's own multi-head attention ran, under any of its class names.
ATTENTION_MODULE = "torch.nn.MultiheadAttention (or a class built on it)"
#: (module, attribute, name shown to the student) replaced at run time.
_TORCH_CALLABLES = (
    ("torch.nn.functional", "scaled_dot_product_attention",
     "torch.nn.functional.scaled_dot_product_attention"),
    ("torch._C._nn", "scaled_dot_product_attention", "torch.nn.functional.scaled_dot_product_attention"),
    ("torch.nn.functional", "multi_head_attention_forward",
     "torch.nn.functional.multi_head_attention_forward"),
    ("torch.nn", "MultiheadAttention", "torch.nn.MultiheadAttention"),
    ("torch.nn.modules", "MultiheadAttention", "torch.nn.MultiheadAttention"),
    ("torch.nn.modules.activation", "MultiheadAttention", "torch.nn.MultiheadAttention"),
)


class ForbiddenAPIError(RuntimeError):
    """Raised when exercise code calls an API that would be the answer."""


def message(what: str) -> str:
    """The one wording of the rule, e.g. ``"attnmask is off limits in exercises: ..."``."""
    return f"{what} {RULE}. Write it with plain torch operations instead."


def is_rule_message(text: str) -> bool:
    """Whether ``text`` is :func:`message` of something forbidden: the grader's words, not a
    submission's that raised an exception of the same name."""
    shown = {*FORBIDDEN_MODULES, *FORBIDDEN_NAMES, FUSED_KERNEL, ATTENTION_MODULE,
             *(name for _, _, name in _TORCH_CALLABLES)}
    return any(text == message(what) for what in shown)


def _is_forbidden_module(name: str) -> str | None:
    for root in FORBIDDEN_MODULES:
        if name == root or name.startswith(root + "."):
            return root
    return None


# --------------------------------------------------------------------------- static scan


@dataclass(frozen=True)
class Finding:
    """A forbidden name reached from exercise ``exercise`` (or None: outside any exercise)."""

    exercise: str | None
    what: str  # e.g. "attnmask" or "scaled_dot_product_attention"
    where: str  # e.g. "line 3 of cell 4 of 02_causal.ipynb"

    @property
    def text(self) -> str:
        return f"{message(self.what)} (used at {self.where})"


def _direct_hits(node: ast.AST) -> Iterator[tuple[str, int]]:
    """(what, line) for every forbidden import, name, attribute or module string under ``node``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for a in n.names:
                root = _is_forbidden_module(a.name)
                if root:
                    yield root, n.lineno
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            root = _is_forbidden_module(n.module)
            if root:
                yield root, n.lineno
            for a in n.names:
                if a.name in FORBIDDEN_NAMES:
                    yield a.name, n.lineno
        elif isinstance(n, ast.Name) and n.id in FORBIDDEN_NAMES:
            yield n.id, n.lineno
        elif isinstance(n, ast.Attribute) and n.attr in FORBIDDEN_NAMES:
            yield n.attr, n.lineno
        elif isinstance(n, ast.Call):
            for kw in n.keywords:
                if kw.arg in FORBIDDEN_NAMES:
                    yield kw.arg, n.lineno
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            root = _is_forbidden_module(n.value)
            if root:
                yield root, n.lineno


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Top-level names an import statement binds."""
    if isinstance(stmt, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.ImportFrom):
        return {a.asname or a.name for a in stmt.names}
    return set()


def _used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def in_body(fn) -> list[Finding]:
    """Forbidden names in ``fn``'s own source (an ``import attnmask`` inside its body): what the
    grader's scan finds and scores 0, though in a notebook the import works."""
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return []
    name = getattr(fn, "__name__", "")
    return [Finding(name, what, f"line {line} of {name}") for what, line in _direct_hits(tree)]


def scan_trees(trees: Iterable[tuple[ast.Module, str, int]], exercises: Iterable[str]) -> list[Finding]:
    """Forbidden uses reachable from each exercise function.

    ``trees`` holds ``(parsed cell, cell label, line offset)`` of one namespace
    (a notebook or a .py file) in order. A function is tainted when its body
    names something forbidden, uses a name bound by a forbidden import, or calls
    another tainted top-level function.
    """
    wanted = set(exercises)
    defs: dict[str, tuple[ast.AST, str, int]] = {}
    tainted_names: dict[str, tuple[str, str]] = {}  # name bound by a forbidden import -> (what, where)
    for tree, label, offset in trees:
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defs[stmt.name] = (stmt, label, offset)
                continue
            hits = list(_direct_hits(stmt))
            if hits and isinstance(stmt, ast.Import | ast.ImportFrom):
                what, line = hits[0]
                for name in _bound_names(stmt):
                    tainted_names[name] = (what, f"line {line + offset} of {label}")

    own: dict[str, tuple[str, str] | None] = {}
    for name, (node, label, offset) in defs.items():
        hit = next(_direct_hits(node), None)
        own[name] = None if hit is None else (hit[0], f"line {hit[1] + offset} of {label}")

    def reach(name: str) -> tuple[str, str] | None:
        # Depth first, with a stack of our own: a chain of 10,000 helpers must not overflow Python's.
        if own.get(name):
            return own[name]
        seen, stack = {name}, [iter(sorted(_used_names(defs[name][0])))]
        while stack:
            used = next(stack[-1], None)
            if used is None:
                stack.pop()
            elif used in tainted_names:
                return tainted_names[used]
            elif used in defs and used not in seen:
                seen.add(used)
                if own.get(used):
                    return own[used]
                stack.append(iter(sorted(_used_names(defs[used][0]))))
        return None

    findings = []
    for name in defs:
        if name in wanted:
            hit = reach(name)
            if hit:
                findings.append(Finding(name, hit[0], hit[1]))
    return findings


# --------------------------------------------------------------------------- run-time blocks


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses forbidden imports with the rule instead of finding the module."""

    def find_spec(self, fullname, path=None, target=None):
        root = _is_forbidden_module(fullname)
        if root:
            raise ImportError(message(root), name=fullname)
        for private in PRIVATE_MODULES:
            if fullname == private or fullname.startswith(private + "."):
                raise ImportError(f"{fullname} is part of the grader and not available to submissions",
                                  name=fullname)
        return None


def block_imports() -> None:
    """Worker only: make forbidden imports fail, for good (also drops cached copies)."""
    for name in list(sys.modules):
        if _is_forbidden_module(name) or name.startswith(PRIVATE_MODULES):
            del sys.modules[name]
    sys.meta_path.insert(0, _Blocker())


def block_reference_files(folders: list[str]) -> None:
    """Worker only: opening any file inside ``folders`` (the reference package, the
    solutions) raises :class:`ForbiddenAPIError`, for good: an audit hook, which no code
    can remove, so the rule holds however the files are reached (another module name,
    ``spec_from_file_location``, ``open``, a symlink), not only for ``import attnmask``."""
    roots = [os.path.realpath(f) for f in folders if f]
    if not roots:
        return

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not args or not isinstance(args[0], str | bytes | os.PathLike):
            return
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if any(path == r or path.startswith(r + os.sep) for r in roots):
            raise ForbiddenAPIError(message("attnmask"))

    sys.addaudithook(hook)


def reference_folders(course_paths: list[str]) -> list[str]:
    """Of the folders hidden from student code, those that hold answers: the
    ``attnmask`` package and ``solutions/``, wherever they are installed."""
    out = []
    for p in course_paths:
        for candidate in (p, os.path.join(p, "attnmask"), os.path.join(p, "solutions")):
            if os.path.basename(candidate) in ("attnmask", "solutions") and os.path.isdir(candidate):
                out.append(candidate)
    return sorted(set(out))


def _forbidden_function(original, shown: str):
    # No reference to ``original`` (no closure, no __wrapped__): the stand-in leads nowhere.
    def forbidden(*args, **kwargs):
        raise ForbiddenAPIError(message(shown))

    forbidden.__name__ = getattr(original, "__name__", shown)
    forbidden.__doc__ = message(shown)
    return forbidden


def _forbidden_class(original, shown: str):
    def __init__(self, *args, **kwargs):
        raise ForbiddenAPIError(message(shown))

    # Not a subclass: __bases__ / __mro__ would hand the real class back.
    return type(original.__name__, (), {"__init__": __init__, "__doc__": message(shown)})


@contextmanager
def forbid_torch_apis() -> Iterator[None]:
    """Replace the forbidden torch callables, block the fused attention operators in the
    dispatcher (:func:`grader.fused.blocked`) and every class built on the real
    ``torch.nn.MultiheadAttention`` (:func:`grader.fused.subclasses_blocked`), while the block
    runs (all restored after)."""
    import torch

    from . import fused

    real_mha = torch.nn.modules.activation.MultiheadAttention  # before the stand-ins replace it
    saved = []
    for module_name, attr, shown in _TORCH_CALLABLES:
        module = sys.modules.get(module_name)
        original = getattr(module, attr, None) if module is not None else None
        if original is None:
            continue
        stand_in = (_forbidden_class if isinstance(original, type) else _forbidden_function)(original, shown)
        saved.append((module, attr, original))
        setattr(module, attr, stand_in)
    try:
        with fused.blocked(lambda name: ForbiddenAPIError(message(FUSED_KERNEL))), \
                fused.subclasses_blocked(real_mha, lambda: ForbiddenAPIError(message(ATTENTION_MODULE))):
            yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)


def forbid_torch_apis_for_good() -> None:
    """:func:`forbid_torch_apis` for the rest of the process, keeping no original: the real
    ``multi_head_attention_forward`` and the others are dropped, not saved to be restored, so
    student code finds them by no path (``sys.modules``, a saved list, a closure, a generator's
    frame, ``gc.get_referrers``). For the sandbox's worker, which never needs them back."""
    import torch

    from . import fused

    real_mha = torch.nn.modules.activation.MultiheadAttention
    for module_name, attr, shown in _TORCH_CALLABLES:
        module = sys.modules.get(module_name)
        original = getattr(module, attr, None) if module is not None else None
        if original is not None:
            setattr(module, attr, (_forbidden_class if isinstance(original, type) else _forbidden_function)(
                original, shown))
    fused.block_for_good(lambda name: ForbiddenAPIError(message(FUSED_KERNEL)))
    fused.refuse_subclasses_for_good(real_mha, lambda: ForbiddenAPIError(message(ATTENTION_MODULE)))


def forbidden_globals(fn) -> list[tuple[dict, str, str]]:
    """``(namespace, name, what)`` for every global a live function reaches that is
    forbidden: attnmask modules and functions, directly or through helper functions
    defined next to it. For the in-notebook check, where attnmask is importable."""
    found: list[tuple[dict, str, str]] = []
    seen: set[int] = set()

    def names_of(code) -> set[str]:
        out = set(code.co_names)
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                out |= names_of(const)
        return out

    def visit(f) -> None:
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            return
        seen.add(id(code))
        glb = getattr(f, "__globals__", {})
        for name in sorted(names_of(code)):
            if name not in glb:
                continue
            obj = glb[name]
            mod = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", None)
            root = _is_forbidden_module(mod) if isinstance(mod, str) else None
            if root:
                found.append((glb, name, root))
            elif callable(obj) and getattr(obj, "__globals__", None) is glb:
                visit(obj)

    visit(fn)
    return found


class Forbidden:
    """Stands in for a forbidden object: any use raises :class:`ForbiddenAPIError`."""

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, attr: str):
        raise ForbiddenAPIError(message(self._what))

    def __call__(self, *args, **kwargs):
        raise ForbiddenAPIError(message(self._what))


@contextmanager
def forbid_globals(fn) -> Iterator[list[str]]:
    """While the block runs, the forbidden globals ``fn`` reaches raise the rule.
    Yields what was found (e.g. ``["attnmask"]``); restores the namespace after."""
    found = forbidden_globals(fn)
    saved = [(glb, name, glb[name]) for glb, name, _ in found]
    for glb, name, what in found:
        glb[name] = Forbidden(what)
    try:
        yield sorted({what for _, _, what in found})
    finally:
        for glb, name, obj in saved:
            glb[name] = obj
