"""Chapter 13, masks inside a kernel: ``block_sparse_forward`` and ``block_sparse_backward``,
Triton kernels over a block-sparse mask's tile lists, run in Triton's CPU interpreter.

The lists decide what is attended: a FULL tile attends everywhere (its mask cells are never
read), a PARTIAL tile where the mask is True, a tile in neither list nowhere. Three kinds of
inputs hold a kernel to that, beside the values themselves:

* keys and values of a tile no query tile lists hold NaN, and the unused tail of every index
  list (past its count) names that tile: reading it, or looping past the count, brings NaN;
* in one case the mask's cells outside partial tiles are random: a kernel that masks full tiles
  too, or reads the mask instead of the lists, gets other numbers;
* the launcher's own PyTorch work is recorded (:attr:`grader.spec.Call.allocations`): a launcher
  that computes attention with torch creates score tensors larger than any it needs to allocate.

Every check needs triton (``requires="triton"``): without it the exercises are skipped, not
counted, and the report says what to install. The cases are small (tile 16, at most 4 x 4 tiles
per head): the interpreter runs one program at a time in numpy.
"""

from __future__ import annotations

import math

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .ch8_speed.backward import X8, backward
from .ch8_speed.forward import online
from .common import judges as J
from .common import live_memory as LM
from .common.inputs import qkv

M = MISTAKES
F32, F16 = torch.float32, torch.float16
TILE = 16
EMPTY, PARTIAL, FULL = 0, 1, 2
#: The exercises whose checks need triton (the ``[kernels]`` extra); skipped without it.
KERNEL_EXERCISES = ("block_sparse_forward", "block_sparse_backward")

#: Chapter 13's classic mistakes, in plain words (one definition each).
MISTAKES13: dict[str, str] = {
    "k_mask_on_full": "the mask is applied inside FULL tiles too: a full tile attends everywhere, and its "
                      "mask cells are not to be read (here they hold anything). Load and apply the mask "
                      "only in the loop over kv_indices, as FlexAttention runs mask_mod on partial "
                      "blocks only.",
    "k_partial_unmasked": "the partial tiles are not masked: a tile in kv_indices attends only where "
                          "the mask is True. Load the mask cells of the tile and set the blocked scores "
                          "to -inf.",
    "k_full_skipped": "the full tiles are never visited: loop over full_kv_indices (full_kv_num_blocks of "
                      "them) as well as over kv_indices.",
    "k_partial_skipped": "the partial tiles are never visited: loop over kv_indices (kv_num_blocks of them) "
                         "as well as over full_kv_indices.",
    "k_lists_ignored": "the tile lists are not what decides which keys are read: a tile in neither list "
                       "must never be loaded (here its keys and values hold NaN, and the entries of "
                       "kv_indices past kv_num_blocks name it). Loop t < kv_num_blocks[b, h, i] and load "
                       "tile kv_indices[b, h, i, t].",
    "k_lse_base2": "lse is in base 2: the contract's lse is the natural log of the row's sum of "
                   "exp(q·k / sqrt(d)). If you work with exp2, divide by log2(e) at the end.",
    "k_lse_max": "lse is the running max alone: lse = m + log(l), the max plus the log of the running sum.",
    "k_lse_empty": "lse of a fully masked row is not -inf: no key was allowed, so the log of the empty "
                   "sum is -inf (and out is 0).",
    "k_torch_launcher": "the attention is computed with PyTorch in the launcher, not in the kernel: the "
                        "launcher created a floating tensor larger than out (or dq, dk, dv). Let the "
                        "launcher allocate the outputs and launch; the scores, softmax and sums belong "
                        "in the @triton.jit kernel.",
}
X13 = MISTAKES13


# --------------------------------------------------------------------------- inputs

def lists_of(classes: torch.Tensor, junk: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices) of tile classes
    ``(B, H, nq, nk)``; every unused entry of an index list holds ``junk (B, H)``."""
    nk = classes.shape[-1]
    order = torch.arange(nk)
    out = []
    for kind in (PARTIAL, FULL):
        which = classes == kind
        count = which.sum(-1)
        idx = ((~which).to(torch.int64) * nk + order).argsort(-1)
        unused = order >= count[..., None]
        idx = torch.where(unused, junk[..., None, None].expand_as(idx), idx)
        out += [count.to(torch.int32), idx.to(torch.int32)]
    return tuple(out)


def classes_of(lists: tuple, nk: int) -> torch.Tensor:
    """The tile classes ``(B, H, nq, nk)`` the lists say (EMPTY, PARTIAL or FULL)."""
    kv_num, kv_idx, full_num, full_idx = (t.long() for t in lists)
    classes = torch.zeros(*kv_num.shape, nk + 1, dtype=torch.long)
    for kind, num, idx in ((PARTIAL, kv_num, kv_idx), (FULL, full_num, full_idx)):
        valid = torch.arange(idx.shape[-1]) < num[..., None]
        classes.scatter_add_(-1, idx.masked_fill(~valid, nk), torch.full_like(idx, kind))
    return classes[..., :nk].clamp(max=FULL)


def cells(classes: torch.Tensor, Lq: int, Lk: int, tile: int) -> torch.Tensor:
    """Tile classes spread to cells: ``(B, H, Lq, Lk)``."""
    return classes.repeat_interleave(tile, -2).repeat_interleave(tile, -1)[..., :Lq, :Lk]


def allowed(mask, lists, Lq, Lk, tile, *, full=True, partial=True, mask_full=False, mask_partial=True):
    """The cells the lists let attend: everywhere in FULL tiles, where ``mask`` is True in PARTIAL
    ones (with the switches of the classic mistakes)."""
    c = cells(classes_of(lists, -(-Lk // tile)), Lq, Lk, tile)
    in_full = (c == FULL) & (mask if mask_full else True) if full else torch.zeros_like(mask)
    in_part = (c == PARTIAL) & (mask if mask_partial else True) if partial else torch.zeros_like(mask)
    return in_full | in_part


def blocky(gen, B, H, Lq, Lk, d, dv, *, dtype=F32, junk=False, empty_row=True, scale=1.0):
    """(q, k, v, mask, *lists) with empty, partial and full tiles in every query tile; one key tile
    per head listed nowhere, its keys and values NaN and the unused list entries naming it; a fully
    masked row (head 0, batch 0) when ``empty_row``; with ``junk``, mask cells outside partial
    tiles random (the kernel must not read them)."""
    nq, nk = -(-Lq // TILE), -(-Lk // TILE)
    classes = torch.randint(0, 3, (B, H, nq, nk), generator=gen)
    never = torch.randint(0, nk, (B, H), generator=gen)
    cols = torch.arange(nk)
    for shift, kind in ((1, PARTIAL), (2, FULL)):
        at = (never + shift) % nk
        classes = torch.where(cols == at[..., None, None], kind, classes)
    classes = torch.where(cols == never[..., None, None], EMPTY, classes)
    if empty_row:
        row = cases.integer(gen, 0, Lq - 1)
        classes[0, 0, row // TILE] = torch.where(classes[0, 0, row // TILE] == FULL, PARTIAL,
                                                 classes[0, 0, row // TILE])
    c = cells(classes, Lq, Lk, TILE)
    noise = cases.random_mask(gen, B, H, Lq, Lk, p=0.5)
    mask = torch.where(c == PARTIAL, noise, c == FULL)
    if junk:
        mask = torch.where(c == PARTIAL, mask, cases.random_mask(gen, B, H, Lq, Lk, p=0.5))
    if empty_row:
        mask[0, 0, row] = mask[0, 0, row] & (c[0, 0, row] != PARTIAL)
    q, k, v = qkv(gen, B, H, Lq, Lk, d, dv, dtype, scale)
    unread = cells(classes, Lq, Lk, TILE).amax(-2) == EMPTY  # (B, H, Lk): keys no query tile reads
    k = k.masked_fill(unread[..., None], float("nan"))
    v = v.masked_fill(unread[..., None], float("nan"))
    return (q, k, v, mask, *lists_of(classes, never))


def late_start(gen, Lq, Lk, d, dv):
    """(q, k, v, mask, *lists) whose first query tile has no full tile, two partial tiles and then
    none, and one of its rows has no allowed key in the first partial tile but one in the second: a
    kernel whose running max starts at -inf and is not guarded meets exp(-inf - (-inf)) there. The
    last key tile is listed nowhere, its keys and values NaN. Needs Lk > 2·TILE."""
    nq, nk = -(-Lq // TILE), -(-Lk // TILE)
    classes = torch.randint(0, 3, (1, 1, nq, nk), generator=gen)
    classes[0, 0, 0] = EMPTY
    classes[0, 0, 0, :2] = PARTIAL
    classes[..., nk - 1] = EMPTY
    c = cells(classes, Lq, Lk, TILE)
    mask = torch.where(c == PARTIAL, cases.random_mask(gen, 1, 1, Lq, Lk, p=0.5), c == FULL)
    row = cases.integer(gen, 0, min(TILE, Lq) - 1)
    mask[0, 0, row, :TILE] = False
    mask[0, 0, row, TILE + cases.integer(gen, 0, TILE - 1)] = True
    q, k, v = qkv(gen, 1, 1, Lq, Lk, d, dv)
    unread = c.amax(-2) == EMPTY  # (1, 1, Lk)
    k = k.masked_fill(unread[..., None], float("nan"))
    v = v.masked_fill(unread[..., None], float("nan"))
    return (q, k, v, mask, *lists_of(classes, torch.full((1, 1), nk - 1)))


def _finite(t: torch.Tensor) -> torch.Tensor:
    return t.nan_to_num(0.0, posinf=0.0, neginf=0.0)


# --------------------------------------------------------------------------- references

def sparse_forward(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                   tile=TILE, **switches):
    """The reference: attention (and its lse) over the cells the tile lists allow."""
    lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    keep = allowed(mask, lists, q.shape[-2], k.shape[-2], tile, **switches)
    return am.attention_lse(q, _finite(k), _finite(v), keep)


def grads_over(q, k, v, d_out, keep):
    """(dq, dk, dv) of attention over the cells ``keep`` allows, by autograd (NaN keys zeroed).
    The gradient of sum(o * d_out) is o's with d_out flowing in, bit for bit; ``o.backward(d_out)``
    would import sympy (torch checks d_out's shape symbolically), half a second of every grading."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, _finite(k), _finite(v))]
    o, _ = am.attention_lse(*leaves, keep)
    (o * d_out.to(o.dtype)).sum().backward()
    return tuple(t.grad for t in leaves)


def sparse_backward(q, k, v, out, lse, d_out, mask, kv_num_blocks, kv_indices, full_kv_num_blocks,
                    full_kv_indices, tile=TILE):
    """The reference gradients (dq, dk, dv) of :func:`sparse_forward`."""
    lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    return grads_over(q, k, v, d_out, allowed(mask, lists, q.shape[-2], k.shape[-2], tile))


def _saved(call_args: tuple) -> tuple:
    """The forward's inputs followed by its out and lse (the reference's, in the inputs' dtype)
    and a random d_out: the backward's arguments."""
    q, k, v, mask, *lists = call_args
    wide = [t.double() for t in (q, k, v)]
    out, lse = sparse_forward(*wide, mask, *lists)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(int(q.shape[-2]) * 7919))
    return (q, k, v, out.to(q.dtype), lse.float(), d_out.to(q.dtype), mask, *lists)


# --------------------------------------------------------------------------- the mistakes, computed

def walked(q, k, v, mask, lists, *, full_first=True, rescale_sum=True, rescale_out=True):
    """The online softmax over each query tile's listed key tiles in the kernel's order (full ones
    first, or partial ones first), with a rescale of the running sum or output left out."""
    kv_num, kv_idx, full_num, full_idx = lists
    B, H, Lq, d = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(work), _finite(k).to(work), _finite(v).to(work)
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=work)
    lse = torch.full((B, H, Lq), float("-inf"), dtype=work)
    for b in range(B):
        for h in range(H):
            for i in range(kv_num.shape[-1]):
                r = slice(i * TILE, (i + 1) * TILE)
                full = [(j, True) for j in full_idx[b, h, i, :int(full_num[b, h, i])].tolist()]
                part = [(j, False) for j in kv_idx[b, h, i, :int(kv_num[b, h, i])].tolist()]
                m = torch.full((q[b, h, r].shape[0], 1), float("-inf"), dtype=work)
                l_, acc = torch.zeros_like(m), torch.zeros(m.shape[0], v.shape[-1], dtype=work)
                for j, is_full in (full + part if full_first else part + full):
                    c = slice(j * TILE, (j + 1) * TILE)
                    s = q[b, h, r] @ k[b, h, c].T / math.sqrt(d)
                    if not is_full:
                        s = s.masked_fill(~mask[b, h, r, c], float("-inf"))
                    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                    shift = torch.where(torch.isinf(m_new), 0.0, m_new)
                    alpha, p = torch.exp(m - shift), torch.exp(s - shift)
                    l_ = (l_ * alpha if rescale_sum else l_) + p.sum(-1, keepdim=True)
                    acc = (acc * alpha if rescale_out else acc) + p @ v[b, h, c]
                    m = m_new
                out[b, h, r] = acc / torch.where(l_ == 0, 1.0, l_)
                lse[b, h, r] = torch.where(l_ == 0, float("-inf"), m + torch.log(l_))[:, 0]
    return out, lse


def forward_mistakes(q, k, v, mask, *lists) -> list[dg.Candidate]:
    Lq, Lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    ref = lambda **kw: sparse_forward(q, k, v, mask, *lists, **kw)  # noqa: E731
    keep = allowed(mask, lists, Lq, Lk, TILE)
    scaled = lambda s: am.attention_lse(q * s * math.sqrt(d), _finite(k), _finite(v), keep)  # noqa: E731
    out, lse = ref()
    empty = ~keep.any(-1)
    return [
        (X13["k_mask_on_full"], lambda: ref(mask_full=True)),
        (X13["k_partial_unmasked"], lambda: ref(mask_partial=False)),
        (X13["k_full_skipped"], lambda: ref(full=False)),
        (X13["k_partial_skipped"], lambda: ref(partial=False)),
        *((M["no_rescale"], lambda kw=kw, first=first: walked(q, k, v, mask, lists, full_first=first, **kw))
          for first in (True, False) for kw in ({"rescale_sum": False}, {"rescale_out": False},
                                                 {"rescale_sum": False, "rescale_out": False})),
        (M["no_rescale"], lambda: (online(q, _finite(k), _finite(v), keep, TILE, rescale_sum=False), lse)),
        (M["no_rescale"], lambda: (online(q, _finite(k), _finite(v), keep, TILE, rescale_out=False), lse)),
        (M["nan_rows"], lambda: (out.masked_fill(empty[..., None], float("nan")), lse)),
        (X13["k_lse_base2"], lambda: (out, lse / math.log(2))),
        (X13["k_lse_max"], lambda: (out, (q @ _finite(k).mT / math.sqrt(d)).masked_fill(~keep, float("-inf"))
                                   .amax(-1))),
        (X13["k_lse_empty"], lambda: (out, lse.masked_fill(empty, 0.0))),
        (X13["k_lse_empty"], lambda: (out, lse.masked_fill(empty, float("nan")))),
        (M["no_scale"], lambda: scaled(1.0)),
        (M["scale_1_over_d"], lambda: scaled(1.0 / d)),
    ]


def _nan_reason(args, got, want) -> str | None:
    """NaN where the reference has none, in rows that have allowed keys, with NaN keys in unlisted
    tiles: those tiles were read. (NaN in fully masked rows only is another mistake.)"""
    q, k, mask, lists = args[0], args[1], args[-5], args[-4:]
    if not bool(torch.isnan(k).any()):
        return None
    bad = torch.isnan(got) & ~torch.isnan(want)
    if bad.shape[-2] != q.shape[-2]:  # dk, dv: rows are keys
        return X13["k_lists_ignored"] if bool(bad.any()) else None
    live = allowed(mask, tuple(lists), q.shape[-2], k.shape[-2], TILE).any(-1)  # (B, H, Lq)
    return X13["k_lists_ignored"] if bool((bad.flatten(3).any(-1) & live).any()) else None


def diagnose_forward(args, kwargs, got, index, dtype) -> str | None:
    q, k, v, mask, *lists = args
    want = sparse_forward(*args, **kwargs)[index]
    candidates = forward_mistakes(q, k, v, mask, *lists)
    return _nan_reason(args, got, want) or dg.name_mistake(got, candidates, dtype, index)


def backward_mistakes(q, k, v, out, lse, d_out, mask, *lists) -> list[dg.Candidate]:
    Lq, Lk = q.shape[-2], k.shape[-2]
    cells_of = lambda **kw: allowed(mask, lists, Lq, Lk, TILE, **kw)  # noqa: E731
    right = cells_of()
    part = lambda keep=right, **kw: backward(q, _finite(k), _finite(v), out, lse, d_out, keep,  # noqa: E731
                                             TILE, **kw)
    return [
        (X8["bwd_no_D"], lambda: part(row_term=False)),
        (X8["bwd_unscaled_scores"], lambda: part(scaled_scores=False)),
        (X8["bwd_grad_unscaled"], lambda: part(grad_scale=False)),
        (X8["bwd_nan_empty"], lambda: part(guard=False)),
        (X13["k_mask_on_full"], lambda: part(cells_of(mask_full=True))),
        (X13["k_partial_unmasked"], lambda: part(cells_of(mask_partial=False))),
        (X13["k_full_skipped"], lambda: part(cells_of(full=False))),
        (X13["k_partial_skipped"], lambda: part(cells_of(partial=False))),
    ]


def diagnose_backward(args, kwargs, got, index, dtype) -> str | None:
    q, k, v, out, lse, d_out, mask, *lists = args
    want = sparse_backward(*args, **kwargs)[index]
    return _nan_reason(args, got, want) or dg.name_mistake(
        got, backward_mistakes(q, k, v, out, lse, d_out, mask, *lists), dtype, index)


LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
FORWARD = J.Recipe("block_sparse_forward", sparse_forward, ("q", "k", "v", "mask", *LISTS),
                   (J.Out("out", "number", "(B, H, Lq, dv)"), J.Out("lse", "logsumexp", "(B, H, Lq)")),
                   diagnose_forward)
BACKWARD = J.Recipe("block_sparse_backward", sparse_backward,
                    ("q", "k", "v", "out", "lse", "d_out", "mask", *LISTS),
                    (J.Out("dq", "number", "(B, H, Lq, d)"), J.Out("dk", "number", "(B, H, Lk, d)"),
                     J.Out("dv", "number", "(B, H, Lk, dv)")), diagnose_backward)


def on_gpu(recipe: J.Recipe, name: str, call: Call) -> Check:
    """The kernel compiled for a GPU, on CUDA tensors: skipped where there is no CUDA (where there
    is, TRITON_INTERPRET is not set and Triton compiles the kernel)."""
    check = J.values(recipe, name, [call], edge=True)  # earns once the CPU cases pass: it confirms them
    check.requires = "cuda"
    return check


def _needs_triton(checks: list[Check]) -> list[Check]:
    for c in checks:
        c.requires = "triton"
    return checks


@exercise(3, "block_sparse_forward(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, "
          "full_kv_indices, tile=16): (out, lse) of attention computed by a @triton.jit kernel that visits "
          "only the listed key tiles (full ones unmasked, partial ones masked by mask); out 0 and lse -inf "
          "on a row with no allowed key; lse float32, natural log.")
def block_sparse_forward_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = FORWARD
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "matches attention over the listed tiles (B=1, H=1, Lq=20, Lk=40), a fully masked row",
                 [Call(blocky(pub, 1, 1, 20, 40, 4, 2))], public=True),
        Check("the launcher computes nothing itself: no floating tensor larger than out (Lq=8, Lk=64, "
              "d=dv=1)", [Call(blocky(pub, 1, 1, 8, 64, 1, 1, empty_row=False), allocations=True)],
              LM.launcher_judge(R, X13["k_torch_launcher"], (0,)), public=True, kind="property", weight=10.0),
    ]
    if not hidden:
        return _needs_triton(checks)
    gen = cases.generator(seed, R.name)
    Lq, Lk = cases.integer(gen, 17, 40), cases.integer(gen, 41, 64)
    d, dv = cases.integer(gen, 3, 8), cases.integer(gen, 2, 4)
    fewer = cases.integer(gen, 33, Lk - 1)  # more queries (Lk of them) than keys
    return _needs_triton(checks + [
        J.values(R, "Lq != Lk, partial last tiles, NaN in every tile no list names, a fully masked row",
                 [Call(blocky(gen, 1, 2, Lq, Lk, d, dv))]),
        J.values(R, "more queries than keys; the mask's cells outside partial tiles hold anything",
                 [Call(blocky(gen, 1, 2, Lk, fewer, d, dv, junk=True))]),
        J.values(R, "float16 inputs, a fully masked row",
                 [Call(blocky(gen, 1, 1, Lq, Lk, d, dv, dtype=F16))]),
        J.values(R, "large scores (q and k scaled by 7, past exp in float32) next to masked keys",
                 [Call(blocky(gen, 1, 1, Lq, Lk, d, dv, scale=7.0))]),
        J.values(R, "a row whose first listed tile allows no key and a later one does (no full tile)",
                 [Call(late_start(gen, Lq, Lk, d, dv))]),
    ]) + [on_gpu(R, "compiles and matches on a CUDA GPU (float16, B=2, H=2)",
                 Call(blocky(gen, 2, 2, Lq, Lk, d, dv, dtype=F16), device="cuda"))]


@exercise(3, "block_sparse_backward(q, k, v, out, lse, d_out, mask, kv_num_blocks, kv_indices, "
          "full_kv_num_blocks, full_kv_indices, tile=16): (dq, dk, dv) from the saved lse with D = "
          "rowsum(d_out * out), computed by @triton.jit kernels over the same tile lists; zeros where no "
          "allowed cell reaches; in the inputs' dtypes.")
def block_sparse_backward_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = BACKWARD
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "matches autograd over the listed tiles (B=1, H=1, Lq=20, Lk=40), a fully masked row",
                 [Call(_saved(blocky(pub, 1, 1, 20, 40, 4, 2)))], public=True),
        Check("the launcher computes nothing itself: no floating tensor larger than dq, dk or dv (Lq=8, "
              "Lk=64, d=dv=1)",
              [Call(_saved(blocky(pub, 1, 1, 8, 64, 1, 1, empty_row=False)), allocations=True)],
              LM.launcher_judge(R, X13["k_torch_launcher"], (0, 1, 2)), public=True, kind="property",
              weight=10.0),
    ]
    if not hidden:
        return _needs_triton(checks)
    gen = cases.generator(seed, R.name)
    Lq, Lk = cases.integer(gen, 17, 40), cases.integer(gen, 41, 64)
    d, dv = cases.integer(gen, 3, 8), cases.integer(gen, 2, 4)
    fewer = cases.integer(gen, 33, Lk - 1)  # more queries (Lk of them) than keys
    return _needs_triton(checks + [
        J.values(R, "Lq != Lk, partial last tiles, NaN in every tile no list names, a fully masked row",
                 [Call(_saved(blocky(gen, 1, 2, Lq, Lk, d, dv)))]),
        J.values(R, "more queries than keys; the mask's cells outside partial tiles hold anything",
                 [Call(_saved(blocky(gen, 1, 1, Lk, fewer, d, dv, junk=True)))]),
        J.values(R, "float16 inputs, a fully masked row",
                 [Call(_saved(blocky(gen, 1, 1, Lq, Lk, d, dv, dtype=F16)))]),
        J.values(R, "large scores (q and k scaled by 7, past exp in float32) next to masked keys",
                 [Call(_saved(blocky(gen, 1, 1, Lq, Lk, d, dv, scale=7.0)))]),
    ]) + [on_gpu(R, "compiles and matches on a CUDA GPU (float16, B=2, H=2)",
                 Call(_saved(blocky(gen, 2, 2, Lq, Lk, d, dv, dtype=F16)), device="cuda"))]
