"""Chapter 10, masks in serving and multimodal models: ``image_text_mask``,
``rolling_cache_mask``, ``paged_attention`` and ``tree_mask``.

The hidden cases draw what breaks real serving code: adjacent image runs, an
image at position 0, images inside padding; empty slots and a wrapped ring;
block tables with unused and shuffled blocks, stale keys after each sequence's
end (loud finite values, then NaN and inf) and sequences ending exactly on a block border;
deep and wide draft trees and an empty cache. Degenerate cases that a simpler mask passes (no image, one
decode query over a ring of exactly ``window`` slots, a one-token tree) are
edges: they earn nothing alone.
"""

from __future__ import annotations

import math

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .common import judges as J
from .common import properties as P

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

#: The chapter's classic mistakes, in plain words (one definition each).
MISTAKES10: dict[str, str] = {
    "image_one_block": "all image tokens of a row form one block, so an image sees the images after it "
                       "(a bug transformers once shipped). Each maximal run of consecutive image tokens is "
                       "its own block: number the runs (a run starts where an image token follows a text "
                       "token).",
    "image_keys_only": "text tokens see image tokens after them: the bidirectional part needs both the query "
                       "and the key in the same image block, not only the key.",
    "image_causal": "the image blocks are causal: an image token must see the whole of its own image, the "
                    "tokens after it in the block included (causal OR same image block).",
    "image_padding": "padded keys reach the image block: the key padding must apply to the bidirectional "
                     "part too, (causal OR same block) AND real key, not (causal AND real key) OR same "
                     "block.",
    "image_no_padding": "padding is ignored: a key that attention_mask marks as padding must be hidden from "
                        "every query.",
    "slot_as_position": "the slot index is used as a position: slot s of a ring holds the position "
                        "slot_pos[b, s], which is not s once the ring has wrapped. Compare slot_pos with "
                        "q_pos.",
    "empty_slots": "empty slots (a negative slot_pos) are visible: a slot that holds nothing must be "
                   "hidden (only slots with a non-negative slot_pos hold a token).",
    "ring_future": "slots holding positions after the query are visible: a chunk writes all its keys "
                   "before attending, so query p must not see slot positions > p.",
    "ring_no_window": "the window is missing, or taken from the number of slots W: query p may see only "
                      "positions p - window < j <= p, and the window argument can be smaller than the ring.",
    "paged_logical": "logical block p is read as physical block p: the keys of position p are in physical "
                     "block block_table[b, p // S], slot p % S. Gather k_cache[block_table] first.",
    "paged_past_len": "keys past context_lens are visible: slots after a sequence's last token (and blocks "
                      "the table marks as unused) hold stale data. Query i sees the positions "
                      "up to context_lens[b] - Lq + i.",
    "paged_stale_read": "a slot that holds no token of the sequence reached the output: slots at or past "
                        "context_lens (and blocks the table marks as unused, read as the first block) may "
                        "hold NaN or infinity, and a mask does not stop them, since a zero weight times NaN "
                        "is NaN "
                        "in weights @ values. Skip them: select only the positions before context_lens "
                        "(torch.where on the keys and values) before any arithmetic, as a paged kernel stops "
                        "reading at context_lens.",
    "paged_no_causal": "the queries see each other's future: query i of Lq sits at position "
                       "context_lens[b] - Lq + i and must not see the later queries' keys.",
    "paged_position_off": "the query positions are off by one: query i of Lq sits at "
                          "context_lens[b] - Lq + i "
                          "and sees itself.",
    "tree_chain": "the draft is read as one sequence (j <= i): siblings and their subtrees are visible. A "
                  "draft token sees only itself and its ancestors.",
    "tree_siblings": "siblings are visible: tokens with the same parent are alternatives, not context.",
    "tree_parent_only": "only the parent is visible, not the grandparent and further ancestors: follow "
                        "parents up to the root.",
    "tree_no_self": "a draft token must see itself (the diagonal of the tree part).",
    "tree_no_cache": "the committed cache is hidden: every draft token sees every one of the past_len "
                     "committed keys.",
    "tree_descendants": "the tree is transposed: a token sees its ancestors, not its descendants.",
    "tree_top_left": "the tree is placed before the cache: the draft keys come after the past_len committed "
                     "keys (the last N columns).",
}
X = MISTAKES10


# --------------------------------------------------------------------------- image_text_mask

def diagnose_images(args, kwargs, got, index, dtype) -> str | None:
    img, att = args
    L = img.shape[1]
    real = att.bool()[:, None, None, :]  # (B, 1, 1, L)
    block = am.image_blocks(img)
    same = ((block[:, :, None] == block[:, None, :]) & (block[:, :, None] > 0))[:, None]
    anyimg = (img[:, :, None] & img[:, None, :])[:, None]
    causal = am.causal_mask(L)
    ref = am.image_text_mask(img, att)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["image_one_block"], lambda: (causal | anyimg) & real),
        (X["image_one_block"], lambda: ((causal | anyimg) & real) | anyimg),
        (X["image_keys_only"], lambda: (causal | img[:, None, None, :]) & real),
        (X["image_padding"], lambda: (causal & real) | same),
        (X["image_no_padding"], lambda: causal | same),
        (X["image_causal"], lambda: causal & real),
        (M["rows_padded_too"], lambda: ref & att.bool()[:, None, :, None]),
        (M["wrong_triangle"], lambda: (causal.T | same) & real),
    ], dtype)


IMAGES = J.Recipe("image_text_mask", am.image_text_mask, ("is_image", "attention_mask"),
                  (J.Out("mask", "mask", "(B, 1, L, L)",
                         lambda a, k: (a[0].shape[0], 1, a[0].shape[1], a[0].shape[1])),),
                  diagnose_images)


def image_rows(gen: torch.Generator, B: int, L: int) -> torch.Tensor:
    """bool (B, L): runs of text and image tokens of random lengths; row 0 starts with an image, row 1
    has two images one text token apart and two runs of text of length 1."""
    rows = []
    for b in range(B):
        row, image = [], b == 0
        while len(row) < L:
            n = 1 if (b == 1 and not image) else cases.integer(gen, 1, 4)
            row += [image] * n
            image = not image
        rows.append(row[:L])
    return torch.tensor(rows)


def padded(gen: torch.Generator, B: int, L: int, left: bool, dtype=torch.long) -> torch.Tensor:
    """(B, L) attention_mask of 0/1, left or right padded, row 0 full and every other row padded."""
    lengths = torch.randint(max(1, L // 2), L, (B,), generator=gen)
    lengths[0] = L
    keep = torch.arange(L)[None] < lengths[:, None]
    return (keep.flip(-1) if left else keep).to(dtype)


@exercise(2, "image_text_mask(is_image, attention_mask): bool (B, 1, L, L), key j real and (j <= i or "
          "i, j in the same maximal run of image tokens).")
def image_text_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = IMAGES
    t = lambda *r: torch.tensor(r)  # noqa: E731
    checks = [
        J.values(R, "one image between text [0 1 1 1 0 0]",
                 [Call((t([0, 1, 1, 1, 0, 0]).bool(), torch.ones(1, 6, dtype=torch.long)))], public=True),
        J.values(R, "two images one token apart, left padding",
                 [Call((t([0, 0, 1, 1, 0, 1, 1], [1, 1, 1, 0, 1, 1, 0]).bool(),
                        t([0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1])))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, L = cases.integer(gen, 3, 4), cases.integer(gen, 8, 12)
    img = image_rows(gen, B, L)
    pad_img = img.clone()
    pad_img[:, :3] = True  # an image run that starts inside the left padding
    adjacent = t([1, 1, 0, 1, 1, 1, 0, 1], [1, 0, 1, 0, 1, 0, 1, 0]).bool()
    no_image = torch.zeros(2, 5, dtype=torch.bool)
    return checks + [
        J.values(R, "random images, right padding (int64 attention_mask)",
                 [Call((img, padded(gen, B, L, left=False))),
                  Call((image_rows(gen, B, L), torch.ones(B, L).long()))]),
        J.values(R, "image runs inside the left padding (bool attention_mask)",
                 [Call((pad_img, padded(gen, B, L, left=True, dtype=torch.bool)))]),
        J.values(R, "runs one text token apart; an image at position 0; an image at the end",
                 [Call((adjacent, torch.ones(2, 8, dtype=torch.long)))]),
        J.values(R, "no image at all; one token", [Call((no_image, padded(gen, 2, 5, left=True))),
                                                  Call((t([True]), t([1])))], edge=True),
        J.dtypes(R, "returns torch.bool", [Call((img, padded(gen, B, L, left=True)))]),
        *P.device_checks(R, "on the inputs' device, vectorised (meta)",
                    [Call((img, padded(gen, B, L, left=True)), device="meta")]),
        P.unchanged(R, "does not modify is_image or attention_mask",
                    [Call((pad_img, padded(gen, B, L, True)))]),
        P.on_cuda(R, "matches on CUDA", [Call((pad_img, padded(gen, B, L, left=True)))]),
    ]


# --------------------------------------------------------------------------- rolling_cache_mask

def diagnose_rolling(args, kwargs, got, index, dtype) -> str | None:
    slot_pos, q_pos, window = args
    W = slot_pos.shape[1]
    j, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]  # (B, 1, 1, W), (B, 1, Lq, 1)
    s = torch.arange(W)
    ref = am.rolling_cache_mask(slot_pos, q_pos, window)
    filled = j >= 0
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["slot_as_position"], lambda: (s <= p) & (s > p - window)),
        (X["slot_as_position"], lambda: filled & (s <= p) & (s > p - window)),
        (M["window_off_by_one"], lambda: am.rolling_cache_mask(slot_pos, q_pos, window + 1)),
        (M["window_off_by_one"], lambda: am.rolling_cache_mask(slot_pos, q_pos, max(window - 1, 1))),
        (X["empty_slots"], lambda: (j <= p) & (j > p - window)),
        (X["empty_slots"], lambda: ref | ~filled),
        (X["ring_future"], lambda: filled & (j > p - window)),
        (X["ring_no_window"], lambda: filled & (j <= p)),
        (X["ring_no_window"], lambda: filled.expand(ref.shape)),
        (X["ring_no_window"], lambda: am.rolling_cache_mask(slot_pos, q_pos, W)),
    ], dtype)


ROLLING = J.Recipe("rolling_cache_mask", am.rolling_cache_mask, ("slot_pos", "q_pos", "window"),
                   (J.Out("mask", "mask", "(B, 1, Lq, W)",
                          lambda a, k: (a[0].shape[0], 1, a[1].shape[1], a[0].shape[1])),),
                   diagnose_rolling)


def ring(n_written, slots: int, Lq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot_pos (B, W), q_pos (B, Lq)): a ring of W slots after n_written[b] tokens; the queries are the
    last Lq of them."""
    n = torch.as_tensor(n_written)
    return am.rolling_slot_positions(n, slots), n[:, None] - Lq + torch.arange(Lq)


@exercise(2, "rolling_cache_mask(slot_pos, q_pos, window): bool (B, 1, Lq, W), slot_pos >= 0 and "
          "q_pos - window < slot_pos <= q_pos.")
def rolling_cache_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ROLLING
    checks = [
        J.values(R, "one query over wrapped rings: 4 slots after 6 tokens, 6 slots after 14, window 3",
                 [Call((*ring([6], 4, 1), 3)), Call((*ring([14], 6, 1), 3))], public=True),
        J.values(R, "a chunk of 3 queries, 6 slots, window 4; a ring not yet full",
                 [Call((*ring([9, 5], 6, 3), 4))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    window = cases.integer(gen, 2, 5)
    Lq = cases.integer(gen, 2, 3)
    W = window + Lq - 1 + cases.integer(gen, 0, 2)  # enough slots for a chunk of Lq queries
    n = torch.tensor([cases.integer(gen, 3 * W, 5 * W), cases.integer(gen, W + 1, 2 * W), Lq,
                      cases.integer(gen, Lq, W - 1)])  # wrapped, wrapped once, empty slots, empty slots
    slot_pos, q_pos = ring(n, W, Lq)
    perm = torch.randperm(W, generator=gen)
    return checks + [
        J.values(R, "chunks over wrapped rings and rings with empty slots",
                 [Call((slot_pos, q_pos, window))]),
        J.values(R, "slots in any order, queries at older positions",
                 [Call((slot_pos[:, perm], q_pos - cases.integer(gen, 1, 2), window))]),
        J.values(R, "window smaller than the ring (one query)", [Call((*ring(n, W + 2, 1), window))]),
        J.values(R, "window 1; window larger than every position", [Call((slot_pos, q_pos, 1)),
                                                                     Call((slot_pos, q_pos, 6 * W))]),
        J.values(R, "one query over a ring of exactly `window` slots", [Call((*ring(n, window, 1), window))],
                 edge=True),
        J.dtypes(R, "returns torch.bool", [Call((slot_pos, q_pos, window))]),
        *P.device_checks(R, "on the inputs' device, vectorised (meta)",
                    [Call((slot_pos, q_pos, window), device="meta")]),
        P.unchanged(R, "does not modify slot_pos or q_pos", [Call((slot_pos, q_pos, window))]),
        P.on_cuda(R, "matches on CUDA", [Call((slot_pos, q_pos, window))]),
    ]


# --------------------------------------------------------------------------- paged_attention

def diagnose_paged(args, kwargs, got, index, dtype) -> str | None:
    q, k_cache, v_cache, table, lens = args
    B, H, Lq, d = q.shape
    Mb, S = table.shape[1], k_cache.shape[2]
    k, v = am.gather_blocks(k_cache, table), am.gather_blocks(v_cache, table)
    pos = torch.arange(Mb * S)
    q_pos = lens[:, None] - Lq + torch.arange(Lq)  # (B, Lq)
    causal = (pos[None, None] <= q_pos[:, :, None])[:, None]  # (B, 1, Lq, Mb*S)
    used = (table >= 0).repeat_interleave(S, dim=1)[:, None, None, :]  # (B, 1, 1, Mb*S)
    att = lambda mask, scale=None, kk=k, vv=v: am.attention(q, kk, vv, mask, scale=scale)[0]  # noqa: E731
    logical = torch.arange(Mb).expand(B, Mb)
    kl, vl = am.gather_blocks(k_cache, logical), am.gather_blocks(v_cache, logical)
    top_left = (pos[None, None] <= torch.arange(Lq)[None, :, None])[:, None]
    reads_stale = not bool(torch.isfinite(got).all()) and not bool(torch.isfinite(k_cache).all()
                                                                   and torch.isfinite(v_cache).all())
    if reads_stale:  # the reference is finite here: only a read of a stale slot makes NaN or inf
        return X["paged_stale_read"]
    return dg.name_mistake(got, [
        (M["top_left"], lambda: att(top_left)),
        (X["paged_logical"], lambda: att(causal, kk=kl, vv=vl)),
        (X["paged_past_len"], lambda: att(used)),
        (X["paged_past_len"], lambda: att(None)),
        (X["paged_no_causal"], lambda: att(pos[None, None, None] < lens[:, None, None, None])),
        (X["paged_position_off"], lambda: att((pos[None, None] <= q_pos[:, :, None] - 1)[:, None])),
        (X["paged_position_off"], lambda: att((pos[None, None] <= q_pos[:, :, None] + 1)[:, None])),
        (M["no_scale"], lambda: att(causal, scale=1.0)),
        (M["scale_1_over_d"], lambda: att(causal, scale=1.0 / d)),
        ("the scores are scaled by one over sqrt(dv), the value width; the scale is one over sqrt(d), d the "
         "width of q and k.",
         lambda: att(causal, scale=1 / math.sqrt(v.shape[-1]))),
    ], dtype)


PAGED = J.Recipe("paged_attention", am.paged_attention,
                 ("q", "k_cache", "v_cache", "block_table", "context_lens"),
                 (J.Out("out", "number", "(B, H, Lq, dv)"),), diagnose_paged)


def paged_case(gen: torch.Generator, lens: list[int], Lq: int, S: int, H: int = 2, d: int = 4, dv: int = 3,
               spare: int = 2, dtype=F32, stale: float | None = None) -> tuple:
    """(q, k_cache, v_cache, block_table, context_lens) for sequences of ``lens`` tokens: blocks handed out
    from a shuffled pool, ``spare`` blocks never used, unused table entries -1, and every slot that holds
    no token of its sequence filled with loud values (about 100) so that any weight on one shows, or with
    ``stale`` (NaN, inf) so that any read of one shows."""
    need = [-(-n // S) for n in lens]
    Mb, N = max(need) + 1, sum(need) + spare
    perm = torch.randperm(N, generator=gen).tolist()
    table = torch.full((len(lens), Mb), -1, dtype=torch.long)
    k_cache = cases.randn(gen, N, H, S, d)
    v_cache = cases.randn(gen, N, H, S, dv) + 100.0  # stale data: any weight on it moves the output far
    for b, (n, m) in enumerate(zip(lens, need)):
        blocks = [perm.pop() for _ in range(m)]
        table[b, :m] = torch.tensor(blocks)
        for p in range(n):
            k_cache[blocks[p // S], :, p % S] = cases.randn(gen, H, d)
            v_cache[blocks[p // S], :, p % S] = cases.randn(gen, H, dv)
    q = cases.randn(gen, len(lens), H, Lq, d)
    if stale is not None:
        held = torch.zeros(N, 1, S, 1, dtype=torch.bool)  # (N, 1, S, 1): slots that hold a token
        for b, n in enumerate(lens):
            for p in range(n):
                held[table[b, p // S], 0, p % S] = True
        k_cache, v_cache = torch.where(held, k_cache, stale), torch.where(held, v_cache, stale)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), table, torch.tensor(lens)


def negative_scores(gen: torch.Generator, case: tuple) -> tuple:
    """``case`` (head width 4) with q and every cache slot replaced so that every score is exact in
    float32 and below -2e9 (:func:`grader.cases.exact_qk`)."""
    q, k_cache, v_cache, table, lens = case
    N, H, S, d = k_cache.shape
    q, k = cases.exact_qk(gen, tuple(q.shape), (H, N * S, d), "negative")  # every slot's key distinct
    return q, k.view(H, N, S, d).transpose(0, 1).contiguous(), v_cache, table, lens


@exercise(3.5, "paged_attention(q, k_cache, v_cache, block_table, context_lens): (B, H, Lq, dv), query i at "
          "position context_lens[b] - Lq + i attends positions 0 .. its own, found at block "
          "block_table[b, p // S], slot p % S; scale 1/sqrt(d); slots at or past context_lens[b] "
          "(NaN, inf) never reach the output.")
def paged_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = PAGED
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "decode: one query, two sequences of 5 and 3 tokens, blocks of 2",
                 [Call(paged_case(pub, [5, 3], 1, 2))], public=True),
        J.values(R, "prefill: a chunk of 3 queries, sequences of 7 and 4 tokens, blocks of 4",
                 [Call(paged_case(pub, [7, 4], 3, 4))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    S, Lq = cases.integer(gen, 2, 4), cases.integer(gen, 2, 3)
    lens = [cases.integer(gen, 2, 4) * S, cases.integer(gen, Lq, 3 * S), Lq, cases.integer(gen, S + 1, 4 * S)]
    case = lambda dtype=F32, lq=Lq: paged_case(gen, lens, lq, S, dtype=dtype)  # noqa: E731
    two_keys = [max(n, Lq + 1) for n in lens]
    return checks + [
        J.values(R, "chunks: a sequence ending on a block border, one of exactly Lq tokens", [Call(case())]),
        J.values(R, "decode (Lq = 1), blocks of 1 and blocks longer than every sequence",
                 [Call(case(lq=1)), Call(paged_case(gen, [1, 3, 2], 1, 1)),
                  Call(paged_case(gen, [3, 5], 2, 8))]),
        J.values(R, "one sequence, block table with unused entries",
                 [Call(paged_case(gen, [S + 1], 1, S, spare=3))]),
        J.values(R, "float16", [Call(case(F16))]),
        J.values(R, "bfloat16", [Call(case(BF16))]),
        J.dtypes(R, "keeps the inputs' dtype", [Call(case(dt)) for dt in cases.FLOATS]),
        # Every query sees two keys or more here (see grader.cases.two_keys_or_none); the NaN stale
        # slots must not reach a gradient either.
        P.gradients(R, "gradients in q, k_cache and v_cache match the reference, NaN in stale slots",
                    [Call(paged_case(gen, two_keys, Lq, S)),
                     Call(paged_case(gen, two_keys, Lq, S, stale=math.nan))]),
        J.values(R, "rows whose every score is below -2e9 (a -1e9 fill outweighs them)",
                 [Call(negative_scores(gen, paged_case(gen, lens, Lq, S, d=cases.EXACT_D)))]),
        *P.device_checks(R, "on the inputs' device, vectorised (meta)", [Call(case(), device="meta")]),
        P.unchanged(R, "does not modify the inputs", [Call(case())]),
        P.on_cuda(R, "matches on CUDA", [Call(case()), Call(case(F16))]),
        J.values(R, "NaN and inf in the slots that hold no token (stale slots, unused blocks)",
                 [Call(paged_case(gen, lens, Lq, S, stale=math.nan)),
                  Call(paged_case(gen, lens, 1, S, stale=math.inf))]),
    ]


# --------------------------------------------------------------------------- tree_mask

def diagnose_tree(args, kwargs, got, index, dtype) -> str | None:
    parents, past = args
    N = parents.shape[0]
    anc = am.tree_ancestors(parents)
    eye = torch.eye(N, dtype=torch.bool)
    cache = torch.ones(N, past, dtype=torch.bool)
    full = lambda tree: torch.cat([cache, tree], dim=1)  # noqa: E731
    sibling = (parents[:, None] == parents[None, :])
    parent_of = parents[:, None] == torch.arange(N)[None, :]
    ref = full(anc)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["tree_chain"], lambda: full(am.causal_mask(N))),
        (X["tree_siblings"], lambda: full(anc | sibling)),
        (X["tree_parent_only"], lambda: full(eye | parent_of)),
        (X["tree_no_self"], lambda: full(anc & ~eye)),
        (X["tree_no_cache"], lambda: torch.cat([torch.zeros(N, past, dtype=torch.bool), anc], dim=1)),
        (X["tree_descendants"], lambda: full(anc.T)),
        (X["tree_top_left"], lambda: torch.cat([anc, cache], dim=1)),
    ], dtype)


TREE = J.Recipe("tree_mask", am.tree_mask, ("parents", "past_len"),
                (J.Out("mask", "mask", "(N, past_len + N)",
                       lambda a, k: (a[0].shape[0], a[0].shape[0] + a[1])),),
                diagnose_tree)


def random_tree(gen: torch.Generator, N: int, deep: bool = False) -> torch.Tensor:
    """long (N,): parents[i] < i drawn at random (-1 included); ``deep``: mostly i - 1."""
    out = []
    for i in range(N):
        if deep and i > 0 and cases.integer(gen, 0, 3) > 0:
            out.append(i - 1)
        else:
            out.append(cases.integer(gen, -1, i - 1))
    return torch.tensor(out, dtype=torch.long)


@exercise(2, "tree_mask(parents, past_len): bool (N, past_len + N), every committed key, and draft key "
          "past_len + a for a = i or an ancestor of i.")
def tree_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = TREE
    t = lambda *p: torch.tensor(p, dtype=torch.long)  # noqa: E731
    checks = [
        J.values(R, "two branches of two tokens after a cache of 2", [Call((t(-1, 0, -1, 2), 2))],
                 public=True),
        J.values(R, "a root with three children and a grandchild, no cache", [Call((t(-1, 0, 0, 0, 2), 0))],
                 public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    N = cases.integer(gen, 7, 12)
    tree = random_tree(gen, N)
    deep = random_tree(gen, N, deep=True)
    deep[0], deep[1], deep[2] = -1, 0, 1  # at least three generations
    wide = torch.full((cases.integer(gen, 3, 6),), -1, dtype=torch.long)
    wide[-1] = 0  # one grandchild under a wide first level
    past = cases.integer(gen, 1, 6)
    return checks + [
        J.values(R, "random trees after a cache",
                 [Call((tree, past)), Call((random_tree(gen, N), past + 2))]),
        J.values(R, "deep trees (a long chain with side branches)", [Call((deep, past)), Call((deep, 0))]),
        J.values(R, "wide trees; past_len = 0", [Call((wide, past)), Call((tree, 0))]),
        J.values(R, "one draft token; a plain chain", [Call((t(-1), past)), Call((t(-1, 0, 1, 2), 1))],
                 edge=True),
        J.dtypes(R, "returns torch.bool", [Call((tree, past))]),
        *P.device_checks(R, "on parents' device, vectorised (meta)", [Call((tree, past), device="meta")]),
        P.unchanged(R, "does not modify parents", [Call((tree, past))]),
        P.on_cuda(R, "matches on CUDA", [Call((tree, past))]),
    ]
