"""The course autograder.

* ``python -m grader SUBMISSION`` grades a notebook, a .py file or a folder of
  them (see :mod:`grader.runners.single.cli`).
* ``grader.grade(path, seed=...)`` does the same in-process and returns a
  :class:`~grader.results.Report` (see :mod:`grader.engine`).
* ``from grader import check; check(causal_mask)`` runs an exercise's public
  checks inside a notebook (see :mod:`grader.runners.single.notebook`).

A submission's files are read only through :mod:`grader.files` (plain files, never
through a link, within size limits).

Attributes are imported lazily: ``import grader`` stays cheap, and the
sandboxed worker imports this package without pulling in the reference.
"""

from __future__ import annotations

__all__ = ["DEFAULT_SEED", "Report", "check", "check_all", "explore", "grade"]

_LAZY = {
    "grade": ("engine", "grade"),
    "DEFAULT_SEED": ("engine", "DEFAULT_SEED"),
    "Report": ("results", "Report"),
    "check": ("runners.single.notebook", "check"),
    "check_all": ("runners.single.notebook", "check_all"),
    "explore": ("explore_cells", "explore"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module 'grader' has no attribute {name!r}")
