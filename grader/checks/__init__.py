"""What the autograder checks: the exercises of the contract, in chapter order.

``EXERCISES[name].make_checks(seed, hidden=False)`` gives the public checks (the
ones the in-notebook ``check`` runs); ``hidden=True`` adds the randomized
hidden checks drawn from ``seed``. Each exercise is declared once, where its checks are
(:func:`grader.spec.exercise`, in a chapter's module ``chN_*.py`` or, for a chapter with more
than one file of checks, its package ``chN_*/``; the judges every chapter shares are in
``common/``), and listed once, in
``attnmask.CONTRACT``.

In the student template there is no ``attnmask`` and no chapter module: there
``EXERCISES`` holds the public checks recorded at release time, judged against the
reference's outputs stored as data (:mod:`grader.checks.recorded`). Nothing here is
imported before ``EXERCISES`` is asked for, so the judges' modules import without the reference.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

from ..spec import Check, Exercise

_CHAPTER = re.compile(r"^ch(\d+)_")


def chapters() -> dict[int, ModuleType]:
    """The chapters' check modules (``chN_*.py`` in this package), by chapter number."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        m = _CHAPTER.match(info.name)
        if m:
            found[int(m.group(1))] = info.name
    return {n: importlib.import_module(f"{__name__}.{found[n]}") for n in sorted(found)}


def modules_of(chapter: ModuleType) -> list[ModuleType]:
    """A chapter's modules: its one module, or the package and every module in it (a chapter
    with more than one file of checks is a package: ``ch8_speed/``, ``ch11_parallel/``)."""
    if not hasattr(chapter, "__path__"):
        return [chapter]
    return [chapter, *(importlib.import_module(f"{chapter.__name__}.{info.name}")
                       for info in pkgutil.iter_modules(chapter.__path__))]


def has_reference() -> bool:
    """True where the checks are computed with the reference (the course), False in the student
    template, which holds only the public checks' recorded data."""
    return any(_CHAPTER.match(info.name) for info in pkgutil.iter_modules(__path__))


def _declared(name: str, modules: dict[int, ModuleType]) -> tuple[int, Callable[..., list[Check]]]:
    """The chapter and the checks of exercise ``name``: its ``NAME_checks``, declared with
    :func:`grader.spec.exercise` in its chapter's module."""
    for chapter, module in modules.items():
        for part in modules_of(module):
            make = getattr(part, f"{name}_checks", None)
            if make is not None and hasattr(make, "statement"):
                return chapter, make
    raise LookupError(f"no chapter of grader/checks declares the checks of {name!r} (@exercise)")


#: make -> its property checks drawn from the public seed, made public (:func:`with_public_rules`):
#: built once per process, by the first grading or notebook ``check`` that asks.
_RULES: dict[Callable[..., list[Check]], list[Check]] = {}


def with_public_rules(make: Callable[..., list[Check]]) -> Callable[..., list[Check]]:
    """``make`` with every property check (dtype, device, inputs unchanged, invariances)
    drawn from the public seed and run among the public checks: a rule the contract
    states is met in the notebook's ``check``, not first in hidden grading. Hidden
    checks then only draw new cases for the values; they add no rule."""

    def make_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
        if _BUILT is not None and (make, seed, hidden) in _BUILT:
            return _BUILT[make, seed, hidden]
        from .. import cases  # here: importing this package must not import torch (the engine's start

        checks = make(seed, hidden)
        if make not in _RULES:  # the same for every seed: drawn once, from the checks just built if they can
            drawn = checks if (seed, hidden) == (cases.PUBLIC_SEED, True) else make(cases.PUBLIC_SEED, True)
            _RULES[make] = [replace(c, public=True) for c in drawn
                            if c.kind == "property" and c.requires is None]
        rules = _RULES[make]
        public = [c for c in checks if c.public]
        rest = [c for c in checks if not c.public and c.kind != "property"]
        if _BUILT is not None:
            _BUILT[make, seed, hidden] = public + rules + rest
        return public + rules + rest

    make_checks.__name__ = make.__name__
    make_checks.__doc__ = make.__doc__
    return make_checks


def declared() -> dict[str, Exercise]:
    """The exercises as the chapters declare them, computed with the reference (``attnmask``),
    in the contract's order (``attnmask.CONTRACT``, the one list of them)."""
    from attnmask import CONTRACT

    modules = chapters()
    out: dict[str, Exercise] = {}
    for name in CONTRACT:
        chapter, make = _declared(name, modules)
        out[name] = Exercise(name, chapter, with_public_rules(make), make.points, make.statement)
    return out


_LOADED: dict[str, Exercise] = {}


def _exercises() -> dict[str, Exercise]:
    if not _LOADED:
        if has_reference():
            _LOADED.update(declared())
        else:
            from . import recorded

            _LOADED.update(recorded.load())
    return _LOADED


#: (make, seed, hidden) -> the checks built: filled by :func:`prepare_class`, None elsewhere.
_BUILT: dict[tuple[Callable, int, bool], list[Check]] | None = None


def prepare_class(seed: int, hidden: bool = True) -> int:
    """Build every exercise's checks for ``seed`` and compute their references now, once:
    class mode calls it in the process it forks every grading from, so that no grading
    builds the same cases or computes the same reference outputs again. Returns how many
    references were kept. Only in that process: a notebook's ``check`` builds afresh."""
    global _BUILT
    from .common import judges, properties

    if not has_reference():  # the student template: nothing to compute ahead
        return 0
    _BUILT = {} if _BUILT is None else _BUILT
    kept = 0
    modules = chapters()
    for name, ex in _exercises().items():
        recipes = [r for part in modules_of(modules[ex.chapter]) for r in vars(part).values()
                   if isinstance(r, judges.Recipe) and r.name == name]
        for check in ex.make_checks(seed, hidden):
            for call in check.calls:
                if call.device != "cpu":
                    continue
                for recipe in recipes:
                    for what in (judges.outputs_of, properties.grads_of)[:1 + check.want_grads]:
                        try:
                            judges.remember(recipe, call, what)
                            kept += 1
                        except Exception:  # noqa: BLE001 -- not this recipe's call: computed when judged
                            pass
    return kept


def forget_class() -> None:
    """Undo :func:`prepare_class`: cases and references are built afresh again."""
    global _BUILT
    from .common import judges

    _BUILT, judges._REMEMBERED = None, None


def public_summary(name: str) -> str:
    """The one-line task statement of exercise ``name``."""
    exercises = _exercises()
    if name not in exercises:
        raise KeyError(f"unknown exercise {name!r}; expected one of {list(exercises)}")
    return exercises[name].statement


def __getattr__(name: str):
    # EXERCISES: the graded exercises, by function name, in the contract's order.
    # POINTS: points per exercise; they add up to 100.
    if name == "EXERCISES":
        return _exercises()
    if name == "POINTS":
        return {n: ex.points for n, ex in _exercises().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EXERCISES", "POINTS", "declared", "forget_class", "has_reference", "prepare_class",
           "public_summary"]
