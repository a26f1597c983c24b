"""The shortcuts of the two diagnosis exercises lose more than half their points on every seed
tried, and correct variants keep full marks (issues 45 and 46): measuring each layer alone, a
threshold divided or absolute, ``>=``, blind to a one-position leak (1.3); one fixed refilling, a
tolerance of 1, no relative tolerance, refilling only the nearest pad, comparing the last
position only (4.2). Every class is drawn in every hidden set, so no seed lets one through."""

from __future__ import annotations

import functools

import pytest
from buggy import correct, grade
from buggy import diagnosis as dx

from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

SHORTCUTS = {
    "find_leaking_layer": ["leak_each_layer_alone", "leak_threshold_divided",
                           "leak_greater_or_equal", "leak_two_positions", "leak_absolute_threshold"],
    "leaks_across_padding": ["pad_tolerance_one", "pad_no_relative_tolerance", "pad_plus_one",
                             "pad_mirror_id",
                             "pad_token_zero", "pad_last_position", "pad_next_to_real_only"],
}
CORRECT = {"find_leaking_layer": [correct.find_leaking_layer, dx.leak_relative_to_mean,
                                  dx.leak_each_layer_own_input],
           "leaks_across_padding": [correct.leaks_across_padding, dx.pad_one_refill_per_trial_kind]}
SEEDS = {"find_leaking_layer": (7, 29), "leaks_across_padding": (7, 29, 1234567)}


@functools.cache
def _checks(name: str, seed: int):
    return [c for c in EXERCISES[name].make_checks(seed, hidden=True) if c.requires is None]


def _share(fn, name: str, seed: int) -> float:
    checks = _checks(name, seed)
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks])


CASES = [(name, fn, seed) for name, fns in SHORTCUTS.items() for fn in fns for seed in SEEDS[name]]


@pytest.mark.parametrize(("name", "shortcut", "seed"), CASES, ids=[f"{f}-{s}" for _, f, s in CASES])
def test_a_shortcut_loses_more_than_half(name, shortcut, seed):
    assert _share(getattr(dx, shortcut), name, seed) < 0.5


OK = [(name, fn, seed) for name, fns in CORRECT.items() for fn in fns for seed in SEEDS[name]]


@pytest.mark.parametrize(("name", "fn", "seed"), OK, ids=[f"{f.__name__}-{s}" for _, f, s in OK])
def test_a_correct_variant_keeps_full_marks(name, fn, seed):
    assert _share(fn, name, seed) == 1.0
