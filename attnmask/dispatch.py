"""Which kernel computes ``attention(q, k, v, mask, need_weights=False)``, and why.

A mask *function* from :mod:`attnmask.predicates` carries what it is
(``kind_of(fn)``), so the fast path can often skip the ``(Lq, Lk)`` mask:

==================================  ================================================
mask (q ``(B, H, Lq, d)``)          kernel
==================================  ================================================
a bool tensor, or ``None``          SDPA with that mask (``"sdpa"``)
``causal(offset)``, offset >= Lk-1  SDPA without a mask: every key is visible
``causal()``, any Lq and Lk         SDPA ``is_causal=True`` (top-left triangle)
``causal(Lk - Lq)``, Lq < Lk        SDPA with ``causal_lower_right(Lq, Lk)``
``causal(Lk - Lq)``, Lq > Lk        zeros for the first Lq - Lk rows (they see no
                                    key), SDPA ``is_causal`` for the last Lk
``sliding_window(w)``, w >= Lq      no key leaves the window: as ``causal()``
``key_padding(lengths)``            SDPA with a ``(B, 1, 1, Lk)`` mask
any other predicate, on CUDA        compiled FlexAttention with a block mask
any other predicate, elsewhere      materialise the mask once, SDPA with it
==================================  ================================================

``causal_lower_right`` is a flag to the CUDA flash and memory-efficient
kernels; on the CPU, PyTorch itself materialises that ``(Lq, Lk)`` mask (small:
Lq < Lk is a KV cache's few new queries).

Why the CPU materialises other predicates: FlexAttention without
``torch.compile`` runs unfused there, and was 4-10x slower than materialising
the mask and calling SDPA (one run: L = 1024 and 2048, B = 1, H = 8, d = 64,
float32, 2 threads, torch 2.13, a sliding window of 256 and 4 packed
documents); compiling it would cost tens of seconds for the first length and
again for the second, which recompiles with symbolic sizes (not part of that
comparison), more than a course notebook's whole run.

On CUDA the ``BlockMask`` of a mask function is built once and kept with the
function (:func:`flex_block_mask`): chapter 7's rule, build it once per batch
and reuse it in every layer, without asking the caller to hold it. A cache must
not change an answer, so the key holds everything the mask depends on: the
sizes, and for a predicate of :mod:`attnmask.predicates` the version counter of
every tensor it closes over (``document`` keeps ``doc_ids`` by reference;
changed in place, it gets a new version and a new BlockMask). A predicate
written elsewhere (kind ``"custom"``) may read anything; its BlockMask is built
on every call and never kept. It is built
with ``H=None`` unless the predicate may read the head (only a custom one can),
and with ``B=None`` unless it reads the batch, so ``create_mask`` does not run
over the whole ``(B, H, Lq, Lk)`` grid. FlexAttention is compiled once per
process with automatic dynamic shapes: a second sequence length recompiles
once with symbolic sizes, and later lengths reuse that graph.

Every path returns what the explicit path returns, a zero output for a fully
masked query row included. :func:`plan` reads shapes, dtypes, the device and
the predicate's label, never tensor values, so it costs nothing on CUDA and
works on the ``meta`` device.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import predicates as P
from .predicates import MaskFn

__all__ = ["Plan", "dense_mask", "flex_block_mask", "plan", "run"]

# Kinds whose predicate never reads b or h: one (Lq, Lk) mask serves every (b, h).
_BATCH_FREE = {"causal", "sliding_window", "prefix_lm", "chunked_local"}
# Kinds whose predicate never reads h: every predicate built in attnmask.predicates.
_HEAD_FREE = _BATCH_FREE | {"key_padding", "document"}
# What compiled FlexAttention handles on CUDA, kept to what PyTorch documents.
_FLEX_DTYPES = {torch.float16, torch.bfloat16, torch.float32}
_FLEX_HEAD_DIMS = {16, 32, 64, 128, 256}


@dataclass(frozen=True)
class Plan:
    """The kernel ``attention`` will call (``kernel``) and the rule that chose it (``reason``)."""

    kernel: str
    reason: str


def _reads_batch(mask_fn: MaskFn) -> bool:
    kind, params = P.kind_of(mask_fn)
    if kind in ("and", "or"):
        return any(_reads_batch(part) for part in params["parts"])
    return kind not in _BATCH_FREE


def _reads_head(mask_fn: MaskFn) -> bool:
    kind, params = P.kind_of(mask_fn)
    if kind in ("and", "or"):
        return any(_reads_head(part) for part in params["parts"])
    return kind not in _HEAD_FREE


def plan(q: torch.Tensor, k: torch.Tensor, mask, *, need_weights: bool) -> Plan:
    """Choose the kernel for ``q (..., Lq, d)``, ``k (..., Lk, d)`` and ``mask``
    (bool tensor, True = may attend; ``None``; or a mask function)."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    if need_weights:
        what = "the predicate is materialised and " if callable(mask) else ""
        return Plan("explicit", f"need_weights=True: {what}the weights are computed and returned")
    if not callable(mask):
        return Plan("sdpa", "a mask tensor (or None) goes to SDPA as it is")
    if q.dim() != 4:
        raise ValueError(f"a mask function needs q (B, H, Lq, d); got q of shape {tuple(q.shape)}. "
                         "Add the missing dimensions with q[None] or view(B, H, Lq, d).")
    kind, params = P.kind_of(mask)
    if kind == "causal":
        offset = params["offset"]
        if offset >= Lk - 1:
            return Plan("sdpa_no_mask", f"causal(offset={offset}) with Lk = {Lk}: every query sees every key")
        if offset == 0:
            return Plan("sdpa_is_causal", "causal() is SDPA's is_causal (top-left triangle)")
        if offset == Lk - Lq and Lq < Lk:
            return Plan("sdpa_causal_lower_right",
                        f"causal(offset = Lk - Lq = {offset}) is the bottom-right triangle")
        if offset == Lk - Lq:
            return Plan("sdpa_is_causal_last_rows",
                        f"causal(offset = Lk - Lq = {offset}): the first {Lq - Lk} query rows see no key "
                        f"(zeros), the last Lk = {Lk} rows are the square triangle")
    if kind == "sliding_window" and params["window"] >= Lq:
        window = params["window"]
        return Plan("sdpa_is_causal", f"sliding_window({window}) with Lq = {Lq}: no key leaves the window, "
                    "so it is causal()")
    if kind == "key_padding":
        return Plan("sdpa_key_padding", "key_padding masks keys only: a (B, 1, 1, Lk) mask, no (Lq, Lk)")
    if (q.device.type == "cuda" and q.dtype in _FLEX_DTYPES and q.shape[-1] in _FLEX_HEAD_DIMS
            and q.shape[-1] == k.shape[-1]):
        return Plan("flex_attention", f"{kind} predicate on CUDA: compiled FlexAttention skips empty blocks")
    if q.device.type == "cuda":
        where = "on CUDA with a dtype or head width FlexAttention is not used for"
    else:
        where = f"on {q.device.type}, where uncompiled FlexAttention is slower"
    return Plan("sdpa_dense_mask", f"{kind} predicate {where}: the mask is materialised once for SDPA")


def _check_params(mask_fn: MaskFn, B: int, Lq: int, Lk: int, device: torch.device) -> None:
    """The tensors a labelled predicate closes over must fit q, k and live on their device."""
    kind, params = P.kind_of(mask_fn)
    if kind in ("and", "or"):
        for part in params["parts"]:
            _check_params(part, B, Lq, Lk, device)
        return
    expected = {"key_padding": ("lengths", (B,), "(B,)"),
                "document": ("doc_ids", (B, max(Lq, Lk)), "(B, L) with L = max(Lq, Lk)")}
    if kind not in expected:
        return
    name, shape, letters = expected[kind]
    t = params[name]
    if tuple(t.shape) != shape:
        raise ValueError(f"{kind}: {name} has shape {tuple(t.shape)}; expected {letters} = {shape}")
    if t.device != device:
        raise ValueError(f"{kind}: {name} is on {t.device} but q is on {device}; "
                         f"build {name} on the inputs' device")


def dense_mask(mask_fn: MaskFn, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Materialise ``mask_fn`` for ``q (B, H, Lq, d)`` and ``k (B, H, Lk, d)`` on q's device.

    Returns:
        bool, True = may attend, broadcasting to ``(B, H, Lq, Lk)``.
    """
    if q.dim() != 4:
        raise ValueError(f"a mask function needs q (B, H, Lq, d); got q of shape {tuple(q.shape)}")
    B, H, Lq, _ = q.shape
    _check_params(mask_fn, B, Lq, k.shape[-2], q.device)
    return P.materialize(mask_fn, Lq, k.shape[-2], B=B, H=H, device=q.device)


_compiled_flex = None
#: mask function -> {(B or None, H or None, Lq, Lk, device): (state, its BlockMask)}, where state
#: is :func:`_state` when it was built. Weak keys: the BlockMasks go when the mask function does (a
#: new batch builds a new document predicate).
_BLOCK_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(mask_fn: MaskFn):
    """What the answer of a labelled predicate depends on beyond the sizes, or ``None`` if it
    cannot be known (a custom predicate, or one built of custom parts).

    Integers and floats a builder closes over cannot change; a tensor can, in place, without
    the predicate noticing. Each tensor is keyed by its identity, storage and version counter
    (shared by views, so ``doc_ids[0] = ...`` through an ``expand`` counts too).
    """
    kind, params = P.kind_of(mask_fn)
    if kind == "custom":
        return None
    state = []
    for name, value in sorted(params.items()):
        if name == "parts":
            parts = tuple(_state(part) for part in value)
            if any(part is None for part in parts):
                return None
            state.append((name, parts))
        elif isinstance(value, torch.Tensor):
            state.append((name, id(value), value.untyped_storage().data_ptr(), value._version))
        elif isinstance(value, (bool, int, float, str)):
            state.append((name, value))
        else:  # a parameter this function does not know how to key
            return None
    return (kind, tuple(state))


def flex_block_mask(mask_fn: MaskFn, B: int, H: int, Lq: int, Lk: int, device: torch.device | str):
    """The ``BlockMask`` of ``mask_fn`` for ``(B, H, Lq, Lk)`` on ``device``, built on the first call
    and returned again on the next ones for the same function, sizes and closed-over tensors.

    Batch and heads are passed to ``create_block_mask`` only if the predicate reads them: a
    ``BlockMask`` built with ``None`` broadcasts, and ``create_mask`` then evaluates the predicate
    over ``(1, 1, Lq, Lk)`` or ``(B, 1, Lq, Lk)`` instead of ``(B, H, Lq, Lk)``.

    A tensor the predicate closes over that was changed in place since the BlockMask was built
    (``doc_ids`` of :func:`attnmask.predicates.document`, say) makes a new one: a stale BlockMask
    would mark tiles "full" that the new mask cuts, and FlexAttention never calls ``mask_mod`` on a
    full tile. A custom predicate, whose captured state cannot be read, is built anew on every call.
    """
    key = (B if _reads_batch(mask_fn) else None, H if _reads_head(mask_fn) else None, Lq, Lk, str(device))
    state = _state(mask_fn)
    if state is None:
        return P.block_mask(mask_fn, Lq, Lk, B=key[0], H=key[1], device=device)
    try:
        built = _BLOCK_MASKS.setdefault(mask_fn, {})
    except TypeError:  # an object without a __weakref__ slot (a class with __slots__): keep nothing
        built = {}
    if key not in built or built[key][0] != state:
        built[key] = (state, P.block_mask(mask_fn, Lq, Lk, B=key[0], H=key[1], device=device))
    return built[key][1]


def _flex(q, k, v, mask_fn, scale):
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled_flex
    if _compiled_flex is None:  # compile once per process, not per call; dynamic=None: a second
        _compiled_flex = torch.compile(flex_attention)  # shape recompiles once, symbolically
    B, H, Lq, _ = q.shape
    block = flex_block_mask(mask_fn, B, H, Lq, k.shape[-2], q.device)
    return _compiled_flex(q, k, v, block_mask=block, scale=scale)


def run(chosen: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_fn: MaskFn,
        scale: float) -> torch.Tensor:
    """Attention of ``q (B, H, Lq, d)``, ``k (B, H, Lk, d)``, ``v (B, H, Lk, dv)`` with a
    mask function, by the kernel ``chosen`` names. Returns ``(B, H, Lq, dv)``."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[-2]
    _check_params(mask_fn, B, Lq, Lk, q.device)
    sdpa = F.scaled_dot_product_attention
    if chosen.kernel == "sdpa_no_mask":
        return sdpa(q, k, v, scale=scale)
    if chosen.kernel == "sdpa_is_causal":
        return sdpa(q, k, v, is_causal=True, scale=scale)
    if chosen.kernel == "sdpa_causal_lower_right":
        from torch.nn.attention.bias import causal_lower_right

        return sdpa(q, k, v, attn_mask=causal_lower_right(Lq, Lk), scale=scale)
    if chosen.kernel == "sdpa_is_causal_last_rows":
        # Flash kernels leave rows that see no key undefined; write the zeros ourselves.
        tail = sdpa(q[..., Lq - Lk:, :], k, v, is_causal=True, scale=scale)  # (B, H, Lk, dv)
        return torch.cat([tail.new_zeros(B, H, Lq - Lk, v.shape[-1]), tail], dim=-2)  # (B, H, Lq, dv)
    if chosen.kernel == "sdpa_key_padding":
        keys = P.materialize(mask_fn, 1, Lk, B=B, device=q.device)  # (B, 1, 1, Lk): one row for all queries
        return sdpa(q, k, v, attn_mask=keys, scale=scale)
    if chosen.kernel == "flex_attention":
        return _flex(q, k, v, mask_fn, scale)
    if chosen.kernel == "sdpa_dense_mask":
        # SDPA's boolean mask gives a fully masked row zeros, like the explicit path.
        return sdpa(q, k, v, attn_mask=dense_mask(mask_fn, q, k), scale=scale)
    raise ValueError(f"run() has no kernel {chosen.kernel!r}; plan() chooses one of the kernels it knows")
