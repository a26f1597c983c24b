"""What the autograder checks: the exercises of the contract, in chapter order.

``EXERCISES[name].make_checks(seed, hidden=False)`` gives the public checks (the
ones the in-notebook ``check`` runs); ``hidden=True`` adds the randomized
hidden checks drawn from ``seed``. Each exercise is declared once, where its checks are
(:func:`grader.spec.exercise`), and listed once, in ``attnmask.CONTRACT``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from attnmask import CONTRACT

from .. import cases
from ..spec import Check, Exercise
from . import (
    ch1_leakage,
    ch2_softmax,
    ch3_padding,
    ch4_combined,
    ch5_cross,
    ch6_cache,
    ch7_variants,
    ch8_speed,
    ch9_real,
    ch10_serving,
)

#: The chapters' check modules, by chapter number.
_CHAPTERS = {1: ch1_leakage, 2: ch2_softmax, 3: ch3_padding, 4: ch4_combined, 5: ch5_cross, 6: ch6_cache,
             7: ch7_variants, 8: ch8_speed, 9: ch9_real, 10: ch10_serving}


def _declared(name: str) -> tuple[int, Callable[..., list[Check]]]:
    """The chapter and the checks of exercise ``name``: its ``NAME_checks``, declared with
    :func:`grader.spec.exercise` in its chapter's module."""
    for chapter, module in _CHAPTERS.items():
        make = getattr(module, f"{name}_checks", None)
        if make is not None and hasattr(make, "statement"):
            return chapter, make
    raise LookupError(f"no chapter of grader/checks declares the checks of {name!r} (@exercise)")


def with_public_rules(make: Callable[..., list[Check]]) -> Callable[..., list[Check]]:
    """``make`` with every property check (dtype, device, inputs unchanged, invariances)
    drawn from the public seed and run among the public checks: a rule the contract
    states is met in the notebook's ``check``, not first in hidden grading. Hidden
    checks then only draw new cases for the values; they add no rule."""

    def make_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
        if _BUILT is not None and (make, seed, hidden) in _BUILT:
            return _BUILT[make, seed, hidden]
        checks = make(seed, hidden)
        rules = [replace(c, public=True) for c in make(cases.PUBLIC_SEED, True)
                 if c.kind == "property" and c.requires is None]
        public = [c for c in checks if c.public]
        rest = [c for c in checks if not c.public and c.kind != "property"]
        if _BUILT is not None:
            _BUILT[make, seed, hidden] = public + rules + rest
        return public + rules + rest

    make_checks.__name__ = make.__name__
    make_checks.__doc__ = make.__doc__
    return make_checks


#: The graded exercises, by function name, in the contract's order (``attnmask.CONTRACT``,
#: the one list of them).
EXERCISES: dict[str, Exercise] = {}
for _name in CONTRACT:
    _chapter, _make = _declared(_name)
    EXERCISES[_name] = Exercise(_name, _chapter, with_public_rules(_make), _make.points, _make.statement)
#: Points per exercise.
POINTS: dict[str, float] = {name: ex.points for name, ex in EXERCISES.items()}


#: (make, seed, hidden) -> the checks built: filled by :func:`prepare_class`, None elsewhere.
_BUILT: dict[tuple[Callable, int, bool], list[Check]] | None = None


def prepare_class(seed: int, hidden: bool = True) -> int:
    """Build every exercise's checks for ``seed`` and compute their references now, once:
    class mode calls it in the process it forks every grading from, so that no grading
    builds the same cases or computes the same reference outputs again. Returns how many
    references were kept. Only in that process: a notebook's ``check`` builds afresh."""
    global _BUILT
    from . import judges

    _BUILT = {} if _BUILT is None else _BUILT
    kept = 0
    for name, ex in EXERCISES.items():
        recipes = [r for r in vars(_CHAPTERS[ex.chapter]).values()
                   if isinstance(r, judges.Recipe) and r.name == name]
        for check in ex.make_checks(seed, hidden):
            for call in check.calls:
                if call.device != "cpu":
                    continue
                for recipe in recipes:
                    try:
                        judges.remember(recipe, call)
                        kept += 1
                    except Exception:  # noqa: BLE001 -- not this recipe's call: computed when judged
                        pass
    return kept


def forget_class() -> None:
    """Undo :func:`prepare_class`: cases and references are built afresh again."""
    global _BUILT
    from . import judges

    _BUILT, judges._REMEMBERED = None, None


def public_summary(name: str) -> str:
    """The one-line task statement of exercise ``name``."""
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; expected one of {list(EXERCISES)}")
    return EXERCISES[name].statement


__all__ = ["EXERCISES", "POINTS", "public_summary"]
