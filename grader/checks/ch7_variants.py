"""Chapter 7, modern variants: ``sliding_window_mask``, ``prefix_lm_mask`` and
``document_mask``; and the tiles a block-sparse kernel walks: ``tile_lists``."""

from __future__ import annotations

import torch

import attnmask as am
from attnmask.block_sparsity import tile_counts

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .ch1_leakage import square
from .common import judges as J
from .common import properties as P
from .common import tile_judge

M = MISTAKES


def length_and_below(low: int):
    """``draw(gen) -> (n, k)`` for random cases: a length 3 <= n <= 12 and low <= k < n."""

    def draw(gen: torch.Generator) -> tuple[int, int]:
        n = cases.integer(gen, 3, 12)
        return (n, cases.integer(gen, low, n - 1))

    return draw


# --------------------------------------------------------------------------- sliding_window_mask

def diagnose_window(args, kwargs, got, index, dtype) -> str | None:
    n, window = args
    ref = am.sliding_window_mask(n, window)
    eye = torch.eye(n, dtype=torch.bool)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (M["window_off_by_one"], lambda: am.sliding_window_mask(n, window + 1)),
        (M["window_off_by_one"], lambda: am.sliding_window_mask(n, window - 1)),
        (M["diagonal_excluded"], lambda: ref & ~eye),
        (M["window_not_causal"], lambda: ref | ref.T),
        (M["wrong_triangle"], lambda: ref.T),
        (M["no_causal"], lambda: torch.ones(n, n, dtype=torch.bool)),
        ("the window is missing: query i may see only the last `window` keys (i - j < window).",
         lambda: am.causal_mask(n)),
    ], dtype)


WINDOW = J.Recipe("sliding_window_mask", am.sliding_window_mask, ("n", "window"),
                  (J.Out("mask", "mask", "(L, L)", square),), diagnose_window)


@exercise(1, "sliding_window_mask(n, window, *, device=None): bool (n, n), j <= i and i - j < window.")
def sliding_window_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    public = [("matches reference (n=6, window=3)", (6, 3)), ("window = 1 sees only itself (n=4)", (4, 1))]
    # the second public case is degenerate (edge): the transposed triangle passes it too
    edges = [("window ≥ n is plain causal", (5, 5)), ("window > n", (4, 9)), ("n = 1", (1, 1))]
    return P.int_mask_checks(WINDOW, seed, hidden, public, edges, length_and_below(2))


# --------------------------------------------------------------------------- prefix_lm_mask

def diagnose_prefix(args, kwargs, got, index, dtype) -> str | None:
    n, p = args
    ref = am.prefix_lm_mask(n, p)
    causal = am.causal_mask(n)
    j = torch.arange(n)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (M["prefix_le"], lambda: causal | (j <= p)[None, :]),
        (M["prefix_and"], lambda: causal & (j < p)[None, :]),
        (M["prefix_rows"], lambda: causal | (j < p)[:, None]),
        (M["no_causal"], lambda: (j < p)[None, :].expand(n, n)),
        ("the prefix is ignored: keys j < prefix_len are visible to every query.", lambda: causal),
        (M["diagonal_excluded"], lambda: ref & ~torch.eye(n, dtype=torch.bool)),
    ], dtype)


PREFIX = J.Recipe("prefix_lm_mask", am.prefix_lm_mask, ("n", "prefix_len"),
                  (J.Out("mask", "mask", "(L, L)", square),), diagnose_prefix)


@exercise(1, "prefix_lm_mask(n, prefix_len, *, device=None): bool (n, n), j <= i or j < prefix_len.")
def prefix_lm_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    public = [("matches reference (n=5, prefix_len=2)", (5, 2)), ("prefix_len = 0 is causal (n=4)", (4, 0))]
    # the second public case is degenerate (edge): plain causal passes it too
    edges = [("prefix_len = n sees everything", (5, 5)), ("n = 1", (1, 1)), ("n = 1, prefix_len = 0", (1, 0))]
    return P.int_mask_checks(PREFIX, seed, hidden, public, edges, length_and_below(1))


# --------------------------------------------------------------------------- document_mask

def runs(doc_ids: torch.Tensor) -> torch.Tensor:
    """Segment numbers that change whenever the id changes: what a solution that
    assumes contiguous documents effectively compares."""
    change = torch.ones_like(doc_ids, dtype=torch.long)
    change[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]).long()
    return change.cumsum(dim=1)


def diagnose_document(args, kwargs, got, index, dtype) -> str | None:
    (ids,) = args
    B, L = ids.shape
    ref = am.document_mask(ids)
    same = (ids[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, L, L)
    causal = am.causal_mask(L)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (M["doc_no_causal"], lambda: same),
        ("documents are ignored: a query may only see keys of its own document.",
         lambda: causal.expand(B, 1, L, L)),
        (M["doc_contiguous"], lambda: am.document_mask(runs(ids))),
        (M["wrong_triangle"], lambda: same & causal.T),
        (M["diagonal_excluded"], lambda: ref & ~torch.eye(L, dtype=torch.bool)),
    ], dtype)


DOCUMENT = J.Recipe("document_mask", am.document_mask, ("doc_ids",),
                    (J.Out("mask", "mask", "(B, 1, L, L)",
                           lambda a, k: (a[0].shape[0], 1, a[0].shape[1], a[0].shape[1])),),
                    diagnose_document)


@exercise(1.5, "document_mask(doc_ids): broadcasts to (B, 1, L, L): same document id and j <= i.")
def document_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = DOCUMENT
    checks = [
        J.values(R, "two documents [0 0 1 1 1]", [Call((torch.tensor([[0, 0, 1, 1, 1]]),))], public=True),
        J.values(R, "a document comes back [5 5 2 5]", [Call((torch.tensor([[5, 5, 2, 5]]),))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    calls = [Call((cases.doc_ids(gen, cases.integer(gen, 2, 3), cases.integer(gen, 6, 12)),))
             for _ in range(2)]
    ids = cases.doc_ids(gen, 2, 8)
    return checks + [
        J.values(R, "unsorted, non-contiguous ids (B > 1)", calls),
        J.values(R, "one document, and one token",
                 [Call((torch.full((2, 5), 7),)), Call((torch.tensor([[3]]),))], edge=True),
        J.dtypes(R, "returns torch.bool", [Call((ids,))]),
        *P.device_checks(R, "on doc_ids' device, vectorised (meta)", [Call((ids,), device="meta")]),
        P.unchanged(R, "does not modify doc_ids", [Call((ids,))]),
        P.on_cuda(R, "matches on CUDA", [Call((ids,))]),
    ]


# --------------------------------------------------------------------------- tile_lists

def classes_of(allowed: torch.Tensor, cells: torch.Tensor | int) -> torch.Tensor:
    """Tile classes (1 partial, 2 full, 0 empty), long ``(B, H, nq, nk)``, from the allowed
    cells of each tile and the cells it is taken to have."""
    full = allowed == cells
    return ((allowed > 0) & ~full).long() + 2 * full.long()


def diagnose_tiles(args, kwargs, got, index, dtype) -> str | None:
    # the judge passes the student's lists as tile classes (grader.checks.tile_judge.classes)
    if index != 0:
        return None
    mask, tile = args[0], (args[1] if len(args) > 1 else kwargs.get("tile", 64))
    allowed, cells = tile_counts(mask, tile)  # (B, H, nq, nk), (nq, nk)
    B, H = mask.shape[:2]
    full, nonempty = (allowed == cells).long(), (allowed > 0).long()
    return dg.name_mistake(got, [
        (M["full_as_partial"], lambda: nonempty + 2 * full),
        (M["full_as_partial"], lambda: nonempty),
        (M["empty_listed"], lambda: (1 - full) + 2 * full),
        (M["boundary_cells"], lambda: classes_of(allowed, tile * tile)),
        (M["boundary_cells"], lambda: classes_of(allowed + tile * tile - cells, tile * tile)),
        (M["one_head_mask"], lambda: classes_of(*tile_counts(mask[:, :1].expand(B, H, -1, -1), tile))),
        (M["one_head_mask"], lambda: classes_of(*tile_counts(mask[:1].expand(B, H, -1, -1), tile))),
        (M["one_head_mask"], lambda: classes_of(*tile_counts(mask[:1, :1].expand(B, H, -1, -1), tile))),
    ], dtype)


def tiles_out(name: str, letters: str):
    def shape(a, k) -> tuple[int, ...]:
        B, H, nq, nk = tile_judge.tiles_shape(Call(a, k))
        return (B, H, nq, nk) if "indices" in name else (B, H, nq)

    return J.Out(name, "integer", letters, shape, lambda a, k: torch.int32)


TILES = J.Recipe("tile_lists", am.tile_lists, ("mask", "tile"),
                 (tiles_out("kv_num_blocks", "(B, H, nq)"), tiles_out("kv_indices", "(B, H, nq, nk)"),
                  tiles_out("full_kv_num_blocks", "(B, H, nq)"),
                  tiles_out("full_kv_indices", "(B, H, nq, nk)")), diagnose_tiles)


def tiled_classes_mask(gen: torch.Generator, B: int, H: int, Lq: int, Lk: int, tile: int) -> torch.Tensor:
    """bool ``(B, H, Lq, Lk)`` drawn tile by tile: each tile (of every (b, h) apart) is empty, full
    or random cells, so every class and every boundary tile occurs."""
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    kinds = torch.randint(0, 3, (B, H, nq, nk), generator=gen)  # 0 empty, 1 random cells, 2 full
    kinds = kinds.repeat_interleave(tile, dim=2).repeat_interleave(tile, dim=3)[..., :Lq, :Lk]
    cells = torch.rand(B, H, Lq, Lk, generator=gen) < 0.5
    return (kinds == 2) | ((kinds == 1) & cells)


def head_windows(B: int, H: int, L: int) -> torch.Tensor:
    """bool ``(B, H, L, L)``: head h a causal sliding window of 2 + 3h keys (the last head
    plain causal), the second sequence two packed documents: real masks with per-head lists."""
    heads = [am.sliding_window_mask(L, 2 + 3 * h if h < H - 1 else L) for h in range(H)]
    mask = torch.stack(heads)[None].repeat(B, 1, 1, 1)  # (B, H, L, L)
    doc_ids = (torch.arange(L) >= L // 3).long()[None]  # (1, L): two documents
    mask[1:] &= am.document_mask(doc_ids)[0]
    return mask


@exercise(2.5, "tile_lists(mask, tile=64): for each query tile, the partial and the full key tiles of a bool "
          "(B, H, Lq, Lk) mask, as FlexAttention's BlockMask holds them (int32 counts and indices).")
def tile_lists_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = TILES
    values = lambda name, calls, **kw: Check(name, calls, tile_judge.tile_lists_judge(R), **kw)  # noqa: E731
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    boundary = tiled_classes_mask(pub, 1, 1, 6, 10, 4)
    boundary[..., 4:, :4] = boundary[..., 8:] = True  # full boundary tiles, rows 4..5 and keys 8..9
    boundary[..., :4, 4:8] = False  # and an empty one
    checks = [
        # the first two are small enough to guess (fewer than 20 cells of output): edge cases
        values("causal, L = 8, tile 4", [Call((am.causal_mask(8)[None, None], 4))], public=True, kind="edge"),
        values("Lq = 6 ≠ Lk = 10, tile 4: boundary tiles", [Call((boundary, 4))], public=True, kind="edge"),
        values("B = 2, H = 3, each head its own window, L = 10, tile 3", [Call((head_windows(2, 3, 10), 3))],
               public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)

    def drawn(Lq=None, Lk=None, tile=None):
        t = tile or cases.integer(gen, 2, 5)
        Lq = Lq or cases.integer(gen, 2 * t + 1, 6 * t - 1)
        return Call((tiled_classes_mask(gen, 2, cases.integer(gen, 2, 3), Lq, Lk or Lq, t), t))

    L = cases.integer(gen, 9, 24)
    small = tiled_classes_mask(gen, 1, 2, 7, 5, 1)
    return checks + [
        values("random tile classes (B = 2, H > 1, L not a multiple of tile)", [drawn(), drawn()]),
        values("Lq ≠ Lk", [drawn(Lq=cases.integer(gen, 7, 13), Lk=cases.integer(gen, 14, 22))]),
        values("causal, sliding windows and documents per head", [Call((head_windows(2, 3, L), 4))]),
        values("tile = 1: every cell its own tile", [Call((small, 1))]),
        values("tile ≥ L: one tile", [Call((head_windows(2, 2, 6), 6)), Call((head_windows(2, 2, 6), 9)),
                                      Call((torch.ones(1, 2, 5, 7, dtype=torch.bool), 8))], kind="edge"),
        Check("returns int32", [drawn()], tile_judge.tile_dtype_judge(R), kind="property"),
        values("tile left out: 64 (L = 70)", [Call((head_windows(1, 2, 70),))]),
        P.on_device(R, "on mask's device, vectorised (meta)",
                    [Call((head_windows(1, 2, 10), 4), device="meta"),
                     Call((head_windows(1, 2, 70),), device="meta")]),
        P.made_on_inputs_device(R, P.MADE_ON_INPUTS, [Call((head_windows(1, 2, 10), 4))]),
        P.unchanged(R, "does not modify mask", [drawn()]),
        Check("matches on CUDA", [c for call in [drawn()] for c in (Call(call.args, {}, "cuda"), call)],
              tile_judge.tile_lists_judge(R, on_cuda=True), requires="cuda"),
    ]
