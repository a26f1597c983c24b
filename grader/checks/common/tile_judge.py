"""The judge of tile lists (exercise 7.4, ``tile_lists``): which key tiles of each query tile
are listed as partial and as full, whatever the entries past each count hold.

``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)`` are read as two tables
of tiles, bool ``(B, H, nq, nk)``: listed as partial, listed as full. A count out of range,
an index out of range or indices not in increasing order are named before any value is
compared; then each tile's class (0 empty, 1 partial, 2 full, 3 in both lists) is compared
with the reference's, and a wrong table is shown as a grid of classes.
"""

from __future__ import annotations

import torch

from ... import diagnose as dg
from ... import errors
from ...spec import Call, Outcome, Verdict
from .judges import Recipe, cpu_args, float_dtype, inputs_of, raised, rebuildable, reference

NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
#: A tile's class as a character in the grids of the feedback: empty, partial, full, in both lists.
SIGNS = ".pF#"
CLASSES = ("empty", "partial", "full", "partial and full")
#: How the student's lists hold a tile of each class.
LISTED = ("in neither list", "listed as partial", "listed as full", "listed as partial and as full")
ASCENDING = ("must list the tiles in increasing order: the first {count} entries of row {row} are {got}; "
             "a kernel walks the keys from left to right")


def table(count: torch.Tensor, indices: torch.Tensor, what: str, shape: tuple[int, ...]
          ) -> tuple[torch.Tensor | None, str | None]:
    """The listed tiles as bool ``(B, H, nq, nk)``, or what is wrong with the two tensors."""
    B, H, nq, nk = shape
    names = (f"{what}num_blocks", f"{what}indices")
    for name, t, want in ((names[0], count, (B, H, nq)), (names[1], indices, shape)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            return None, f"{name} is {dg.dtype_str(t.dtype)}; expected integers (torch.int32)"
        if tuple(t.shape) != want:
            return None, (f"{name} has shape {dg.shape_str(t.shape)}; expected {dg.shape_str(want)} "
                          "= (B, H, nq" + (", nk)" if len(want) == 4 else ")"))
    count, indices = count.long(), indices.long()
    if bool(((count < 0) | (count > nk)).any()):
        at = tuple(int(i) for i in ((count < 0) | (count > nk)).nonzero()[0])
        return None, f"{names[0]}{list(at)} is {int(count[at])}; a count lies between 0 and nk = {nk}"
    used = torch.arange(nk) < count[..., None]  # (B, H, nq, nk): the entries that are read
    idx = torch.where(used, indices, 0)
    outside = used & ((idx < 0) | (idx >= nk))
    if bool(outside.any()):
        at = tuple(int(i) for i in outside.nonzero()[0])
        return None, (f"{names[1]}{list(at)} is {int(idx[at])}; a key tile's index lies between 0 and "
                      f"nk - 1 = {nk - 1}")
    wrong = used[..., 1:] & (idx[..., 1:] <= idx[..., :-1])
    if bool(wrong.any()):
        row = tuple(int(i) for i in wrong.nonzero()[0][:3])
        n = int(count[row])
        return None, f"{names[1]} " + ASCENDING.format(count=n, row=list(row), got=idx[row][:n].tolist())
    listed = torch.zeros(shape, dtype=torch.long).scatter_add_(-1, idx, used.long())
    return listed > 0, None


def classes(outputs: list[torch.Tensor], shape: tuple[int, ...]) -> tuple[torch.Tensor | None, str | None]:
    """Each tile's class, long ``(B, H, nq, nk)``: 1 when listed as partial, + 2 when listed as full."""
    partial, msg = table(outputs[0], outputs[1], "kv_", shape)
    if msg:
        return None, msg
    full, msg = table(outputs[2], outputs[3], "full_kv_", shape)
    if msg:
        return None, msg
    return partial.long() + 2 * full.long(), None


def tiles_shape(call: Call) -> tuple[int, int, int, int]:
    """``(B, H, nq, nk)`` of a call ``tile_lists(mask, tile)``."""
    mask = call.args[0]
    tile = call.args[1] if len(call.args) > 1 else call.kwargs.get("tile", 64)
    B, H, Lq, Lk = mask.shape
    return B, H, -(-Lq // tile), -(-Lk // tile)


def grid(codes: torch.Tensor) -> str:
    """One (b, h)'s classes as rows of characters (:data:`SIGNS`), query tiles down, key tiles across."""
    return "\n".join("  " + "".join(SIGNS[int(c)] for c in row) for row in codes[:16, :32])


def judge_lists(recipe: Recipe, call: Call, outcome: Outcome) -> Verdict | None:
    """None when the lists of ``call`` classify every tile as the reference does; else why not."""
    inputs = inputs_of(recipe, call)
    if outcome.error is not None:
        return raised(outcome.error, inputs)
    got, msg = dg.unpack(outcome.output, NAMES)
    if msg:
        return dg.fail(msg, f"inputs: {inputs}")
    shape = tiles_shape(call)
    mine, msg = classes(got, shape)
    if msg:
        return dg.fail(msg, f"inputs: {inputs}")
    want, _ = classes(reference(recipe, call), shape)
    if torch.equal(mine, want):
        return None
    args, kwargs = cpu_args(call)
    said = recipe.diagnosis(call, args, kwargs, mine, 0, float_dtype(call))
    b, h, i, j = (int(x) for x in (mine != want).nonzero()[0])
    tile = call.args[1] if len(call.args) > 1 else call.kwargs.get("tile", 64)
    Lq, Lk = call.args[0].shape[2:]
    where = (f"tile ({b}, {h}, {i}, {j}) (queries {i * tile}..{min((i + 1) * tile, Lq) - 1}, keys "
             f"{j * tile}..{min((j + 1) * tile, Lk) - 1}) is {LISTED[int(mine[b, h, i, j])]}; "
             f"it is {CLASSES[int(want[b, h, i, j])]}")
    detail = (f"inputs: {inputs}\nclasses of (b, h) = ({b}, {h}), '.' empty, 'p' partial, 'F' full, "
              f"'#' in both lists; query tiles down, key tiles across\nexpected:\n{grid(want[b, h])}\n"
              f"got:\n{grid(mine[b, h])}")
    return dg.fail(f"{where}: {said}" if said else where, detail)


@rebuildable(names_mistakes=True)
def tile_lists_judge(recipe: Recipe, on_cuda: bool = False):
    """Every call's lists classify every tile as the reference's do (entries past each count
    are never read). ``on_cuda``: calls come in pairs (cuda, cpu); the CUDA result must be on
    CUDA and classify as the reference does."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        step = 2 if on_cuda else 1
        order = sorted(range(0, len(calls), step), key=lambda k: calls[k].args[0].numel())
        for k in order:
            call, outcome = calls[k], outcomes[k]
            if on_cuda:
                if outcome.error is not None:
                    return dg.fail("on CUDA " + errors.explain_error(outcome.error),
                                   f"inputs on cuda: {inputs_of(recipe, call)}")
                devices = outcome.devices if isinstance(outcome.devices, tuple | list) else (outcome.devices,)
                off = [f"{n} is on {d}" for n, d in zip(NAMES, devices) if d != "cuda"]
                if off:
                    return dg.fail(f"{off[0]}; expected cuda (build every new tensor on mask.device)")
            verdict = judge_lists(recipe, call, outcome)
            if verdict is not None:
                return dg.fail(("on CUDA " if on_cuda else "") + verdict.message, verdict.detail)
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def tile_dtype_judge(recipe: Recipe):
    """Every output is int32, as FlexAttention's BlockMask holds its lists."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, outcome in zip(calls, outcomes):
            if outcome.error is not None:
                return raised(outcome.error, inputs_of(recipe, call))
            got, msg = dg.unpack(outcome.output, NAMES)
            if msg:
                return dg.fail(msg)
            for name, t in zip(NAMES, got):
                if t.dtype != torch.int32:
                    return dg.fail(f"{name} is {dg.dtype_str(t.dtype)}; expected int32, as FlexAttention's "
                                   "BlockMask holds its lists", f"inputs: {inputs_of(recipe, call)}")
        return dg.PASS

    return dg.judged(judge)
