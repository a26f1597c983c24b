"""Chapter 7, modern variants: ``sliding_window_mask``, ``prefix_lm_mask`` and
``document_mask``."""

from __future__ import annotations

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .ch1_leakage import square
from .common import judges as J
from .common import properties as P

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


@exercise(1.5, "sliding_window_mask(n, window, *, device=None): bool (n, n), j <= i and i - j < window.")
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


@exercise(1.5, "prefix_lm_mask(n, prefix_len, *, device=None): bool (n, n), j <= i or j < prefix_len.")
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


@exercise(2.5, "document_mask(doc_ids): broadcasts to (B, 1, L, L): same document id and j <= i.")
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
        P.on_device(R, "on doc_ids' device, vectorised (meta)", [Call((ids,), device="meta")]),
        P.unchanged(R, "does not modify doc_ids", [Call((ids,))]),
        P.on_cuda(R, "matches on CUDA", [Call((ids,))]),
    ]
