"""The judge of exercises whose answer is a plain value, not a tensor: the index of a layer
or None (``find_leaking_layer``), yes or no (``leaks_across_padding``).

A reference answer is kept as a 0-d long tensor (an index, -1 for None; 1 / 0 for True /
False) so that release records it and :func:`grader.diagnose.name_mistake` compares it like
any other output. Each call of a check is one model or decoder; a check passes only when
every call is answered right, and the checks mix models of every answer, so a constant
answer fails them all.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import diagnose as dg
from ...spec import Call, Outcome, Verdict
from .judges import Recipe, cpu_args, float_dtype, inputs_of, raised, rebuildable, reference

#: What each kind of answer must be, in words.
SHAPES = {"index": "an int (a layer's index) or None", "bool": "True or False (a Python bool)"}


def encode(answer: Any, kind: str) -> torch.Tensor | None:
    """A returned answer as the 0-d long tensor the reference's is kept as; None when it is not
    an answer of ``kind`` (a bool is not an index, an int is not a bool)."""
    if kind == "index":
        if answer is None:
            return torch.tensor(-1)
        if type(answer) is int and answer >= 0:
            return torch.tensor(answer)
        return None
    if type(answer) is bool:
        return torch.tensor(int(answer))
    return None


def decode(t: torch.Tensor, kind: str) -> str:
    """The answer a kept tensor stands for, as the student would write it."""
    v = int(t)
    if kind == "index":
        return "None" if v < 0 else str(v)
    return str(bool(v))


def wrong_answer(got: torch.Tensor, want: torch.Tensor, kind: str) -> str:
    """What was wrong with the answer, in words that still read when a hidden check's numbers are
    masked: which way it missed, then the values."""
    g, w = int(got), int(want)
    if kind == "bool":
        return ("answered True, but the decoder does not leak" if g
                else "answered False, but the decoder leaks")
    if g < 0:
        return f"answered None, but a layer leaks (the first is layer {w})"
    if w < 0:
        return f"answered layer {g}, but no layer leaks"
    side = "a later" if g > w else "an earlier"
    return f"answered layer {g}, {side} layer than the first that leaks (layer {w})"


def describe(answer: Any) -> str:
    if answer is None or type(answer) in (bool, int):
        return repr(answer)
    return dg.describe(answer)


@rebuildable(names_mistakes=True)
def answers_judge(recipe: Recipe, kind: str, what: str):
    """Every call's returned answer (``kind`` "index" or "bool") equals the reference's.
    ``what`` names the answer ("the leaking layer"); the messages say which way a wrong one missed
    (:func:`wrong_answer`)."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, outcome in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            if outcome.error is not None:
                return raised(outcome.error, inputs)
            got = encode(outcome.output, kind)
            if got is None:
                return dg.fail(f"returned {describe(outcome.output)}; expected {SHAPES[kind]}",
                               f"inputs: {inputs}")
            (want,) = reference(recipe, call)
            if int(got) == int(want):
                continue
            args, kwargs = cpu_args(call)
            said = recipe.diagnosis(call, args, kwargs, got, 0, float_dtype(call))
            wrong = wrong_answer(got, want, kind)
            return dg.fail(f"{wrong}: {said}" if said else wrong, f"inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)
