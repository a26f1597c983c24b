"""The judge of memory as what is alive at once: during a call, the floating tensors it has created
and still holds never add up to ``share`` of the score matrix of its queries against its keys.

The worker records that peak for calls that ask (:attr:`grader.spec.Call.allocations`,
:class:`grader.sandbox.execute.Allocations`): a tensor counts from the operation that creates it
until its memory is freed, so the weights autograd keeps for its backward, the tiles of a matrix
kept in a list and a matrix built whole all count, while one tile used and let go does not.
The score matrix of ``q (..., Lq, d)`` against ``k (..., Lk, d)`` has ``prod(q.shape[:-1]) · Lk``
entries: B·H·Lq·Lk for attention's (B, H, Lq, d) queries.

The same record's largest tensor judges chapter 13's launchers (:func:`launcher_judge`): a launcher
that computes with PyTorch instead of its kernel creates a tensor as large as the scores.
"""

from __future__ import annotations

import math

from ... import diagnose as dg
from ...spec import Call, Outcome, Verdict
from .judges import Recipe, inputs_of, raised, rebuildable


def score_entries(call: Call) -> int:
    """Entries of the score matrix of the call's queries (its first argument) against its keys
    (its second): ``prod(q.shape[:-1]) · k.shape[-2]``."""
    q, k = call.args[0], call.args[1]
    return math.prod(q.shape[:-1]) * k.shape[-2]


@rebuildable
def live_memory_judge(recipe: Recipe, message: str, share: float = 0.5):
    """Every call's peak of live floating entries (:attr:`grader.spec.Outcome.peak`) stays below
    ``share`` of :func:`score_entries`; ``message``: what crossing it means for this exercise."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            if o.error is not None:
                return raised(o.error, inputs)
            if o.peak is None:
                return dg.fail("the tensors created during the call were not recorded")
            whole = score_entries(call)
            bound = int(share * whole)
            if o.peak >= bound:
                return dg.fail(message, f"at the busiest moment of the call, the floating tensors it had "
                               f"created and still held had {o.peak} entries; the whole score matrix has "
                               f"{whole}, and the bound is {bound} (a share of {share:g} of it); "
                               f"inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def one_shard_judge(recipe: Recipe, message: str):
    """A ring's rank meets one shard of keys at a time (chapter 11): no floating tensor created
    during the call (:attr:`grader.spec.Outcome.largest`) holds as many entries as one rank's queries
    against every key, B·H·(L / world)·L, half of which is still twice the largest score tile of a
    step (its L / world queries against a shard of L / world keys). The call's fourth argument is
    ``world``."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            if o.error is not None:
                return raised(o.error, inputs)
            if o.largest is None:
                return dg.fail("the tensors created during the call were not recorded")
            bound = score_entries(call) // (2 * int(call.args[3]))
            entries = math.prod(o.largest)
            if entries >= bound:
                return dg.fail(message, f"the largest floating tensor created has shape "
                               f"{dg.shape_str(o.largest)}, {entries} entries; a rank's queries against "
                               f"every key have {2 * bound}, and the bound is {bound}; inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def launcher_judge(recipe: Recipe, message: str, outputs: tuple[int, ...]):
    """A kernel's launcher computes nothing itself (chapter 13): no floating tensor it creates with
    PyTorch during a call (:attr:`grader.spec.Call.allocations`; the kernel's own work, in Triton,
    is not seen) is larger than the largest of the argument tensors at ``outputs``, those the
    outputs are shaped like. ``message``: what computing in the launcher means."""

    def judge(calls: list[Call], outcomes: list) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = inputs_of(recipe, call)
            if o.error is not None:
                return raised(o.error, inputs)
            if o.largest is None:
                return dg.fail("the tensors created during the call were not recorded")
            bound = max(call.args[i].numel() for i in outputs)
            entries = 1
            for n in o.largest:
                entries *= n
            if entries > bound:
                return dg.fail(message, f"the largest floating tensor created has shape "
                               f"{dg.shape_str(o.largest)}, {entries} entries; the outputs have at most "
                               f"{bound} each; inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)
