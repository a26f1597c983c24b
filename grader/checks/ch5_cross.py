"""Chapter 5, encoder-decoder: ``encoder_decoder_masks`` and ``multi_head_attention``."""

from __future__ import annotations

import math

import torch

import attnmask as am
from attnmask.mha import merge_heads, split_heads

from .. import cases
from .. import diagnose as dg
from ..cases import with_empty_row
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .ch2_softmax import softmax_mistakes
from .ch4_combined import decoder_mistakes
from .common import judges as J
from .common import properties as P

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


# --------------------------------------------------------------------------- encoder_decoder_masks

def encoder_mistakes(src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, S: int, T: int,
                     index: int) -> list[dg.Candidate]:
    """The classic mistakes of one of the three masks, as full-shape masks."""
    B = src_lengths.shape[0]
    if index == 1:
        return decoder_mistakes(tgt_lengths, T)
    Lq = S if index == 0 else T
    src = am.padding_mask(src_lengths, S)[:, None, None, :]  # (B, 1, 1, S)
    rows = am.padding_mask(src_lengths if index == 0 else tgt_lengths, Lq)[:, None, :, None]  # (B, 1, Lq, 1)
    full = lambda m: m.expand(B, 1, Lq, S)  # noqa: E731
    out = [
        (M["inverted"], lambda: full(~src)),
        (M["rows_padded_too"], lambda: full(src & rows)),
        (M["queries_padded"], lambda: full(rows)),
        (M["no_padding"], lambda: torch.ones(B, 1, Lq, S, dtype=torch.bool)),
    ]
    if index == 0:
        out.append((M["enc_causal"], lambda: full(src & am.causal_mask(S))))
    else:
        out += [
            (M["cross_causal"], lambda: full(src & am.causal_mask(T, n_keys=S, align="top_left"))),
            (M["cross_causal"], lambda: full(src & am.causal_mask(T, n_keys=S))),
            (M["cross_wrong_lengths"], lambda: full(torch.arange(S) < tgt_lengths[:, None, None, None])),
        ]
    return out


def diagnose_enc_dec(args, kwargs, got, index, dtype) -> str | None:
    return dg.name_mistake(got, encoder_mistakes(*args, index), dtype)


def _shapes(i: int):
    def shape(args: tuple, kwargs: dict) -> tuple[int, ...]:
        B, S, T = args[0].shape[0], args[2], args[3]
        return [(B, 1, S, S), (B, 1, T, T), (B, 1, T, S)][i]

    return shape


ENC_DEC = J.Recipe(
    "encoder_decoder_masks", am.encoder_decoder_masks, ("src_lengths", "tgt_lengths", "src_len", "tgt_len"),
    (J.Out("enc_self", "mask", "(B, 1, S, S)", _shapes(0)),
     J.Out("dec_self", "mask", "(B, 1, T, T)", _shapes(1)),
     J.Out("cross", "mask", "(B, 1, T, S)", _shapes(2))),
    diagnose_enc_dec,
)

TITLES = ("enc_self: source key padding", "dec_self: causal + target key padding",
          "cross: source key padding, no causal")


@exercise(1.5, "encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len): (enc_self, dec_self, "
          "cross) masks for (B,1,S,S), (B,1,T,T), (B,1,T,S).")
def encoder_decoder_masks_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ENC_DEC
    pub = Call((torch.tensor([3, 5]), torch.tensor([4, 2]), 5, 4))
    checks = [J.values(R, f"{title} (S=5, T=4)", [pub], public=True, only=[i])
              for i, title in enumerate(TITLES)]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    calls = []
    for _ in range(2):
        B, S, T = cases.integer(gen, 2, 4), cases.integer(gen, 3, 9), cases.integer(gen, 2, 8)
        T += T == S  # S != T, so a swapped mask cannot pass
        calls.append(Call((cases.lengths(gen, B, S), cases.positive_lengths(gen, B, T), S, T)))
    B, S, T = 3, cases.integer(gen, 4, 7), cases.integer(gen, 8, 10)
    one = Call((cases.lengths(gen, B, S), cases.lengths(gen, B, T), S, T))
    return checks + [
        *[J.values(R, f"{title} (random)", calls, only=[i]) for i, title in enumerate(TITLES)],
        J.values(R, "one source and one target token",
                 [Call((torch.tensor([1, 0]), torch.tensor([1, 1]), 1, 1))], edge=True),
        J.dtypes(R, "returns torch.bool masks", [one]),
        *P.device_checks(R, "on lengths' device, vectorised (meta)", [Call(one.args, device="meta")]),
        P.unchanged(R, "does not modify the lengths", [one]),
        P.on_cuda(R, "matches on CUDA", [one]),
    ]


# --------------------------------------------------------------------------- multi_head_attention

def wrong_split(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, d) by a bare view: heads mix positions and features."""
    B, L, D = x.shape
    return x.reshape(B, n_heads, L, D // n_heads)


def wrong_merge(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d) -> (B, L, D) without moving the head axis back first."""
    B, H, L, d = x.shape
    return x.reshape(B, L, H * d)


#: The head split and merge both done by a bare reshape: every shape is right, the heads are not. The mask is
#: not the problem, so the padding and future properties name this before they blame the mask.
HEADS_UNMOVED = ("the heads are split and merged by a bare reshape between (B, L, D) and (B, H, L, d): the "
                 "shapes "
                 "are right but head h then holds a block of positions, not the h-th group of d features of "
                 "every position, so positions leak into each other whatever the mask. Split the last axis "
                 "into (H, d) first, then move the head axis in front of the positions; merge in the reverse "
                 "order.")


def mha_variant(x_q, x_kv, w_q, w_k, w_v, w_o, H, mask=None, *, scale=None, lin=None,
                split=split_heads, merge=merge_heads, project_out=True):
    """Multi-head attention built from attnmask's pieces with one piece swapped."""
    lin = lin or (lambda x, w: x @ w.T)
    q, k, v = split(lin(x_q, w_q), H), split(lin(x_kv, w_k), H), split(lin(x_kv, w_v), H)
    out, _ = am.attention(q, k, v, mask, scale=scale)
    out = merge(out)
    return lin(out, w_o) if project_out else out


def mha_mistakes(x_q, x_kv, w_q, w_k, w_v, w_o, H, mask=None) -> list[dg.Candidate]:
    ws = (x_q, x_kv, w_q, w_k, w_v, w_o, H)
    D = x_q.shape[-1]
    out = [
        (M["scale_sqrt_D"], lambda: mha_variant(*ws, mask, scale=1 / math.sqrt(D))),
        (M["no_scale"], lambda: mha_variant(*ws, mask, scale=1.0)),
        (M["scale_1_over_d"], lambda: mha_variant(*ws, mask, scale=H / D)),
        ("the weights are applied as x @ w; the contract applies them as x @ w.T (like nn.Linear).",
         lambda: mha_variant(*ws, mask, lin=lambda x, w: x @ w)),
        ("the heads are split with a bare view(B, H, L, d): that mixes positions into heads. Use "
         "a view to (B, L, H, d), then move the head axis in front of the positions.",
         lambda: mha_variant(*ws, mask, split=wrong_split)),
        ("the heads are merged without moving the head axis back: move it behind the positions again, then "
         "reshape to (B, L, D), before the output projection.",
         lambda: mha_variant(*ws, mask, merge=wrong_merge)),
        (HEADS_UNMOVED, lambda: mha_variant(*ws, mask, split=wrong_split, merge=wrong_merge)),
        ("the output projection w_o is missing: return merged_heads @ w_o.T.",
         lambda: mha_variant(*ws, mask, project_out=False)),
    ]
    if mask is not None:
        out.append((M["inverted"], lambda: mha_variant(*ws, ~mask)))
        q, k, v = (split_heads(x @ w.T, H) for x, w in ((x_q, w_q), (x_kv, w_k), (x_kv, w_v)))
        scores = q @ k.mT / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
        for message, thunk in softmax_mistakes(scores, mask):
            if message in (M["nan_rows"], M["global_max"], M["after_softmax"], M["uniform_rows"]):
                out.append((message, lambda thunk=thunk: merge_heads(thunk() @ v) @ w_o.T))
    return out


def diagnose_mha(args, kwargs, got, index, dtype) -> str | None:
    return dg.name_mistake(got, mha_mistakes(*args), dtype)


MHA = J.Recipe("multi_head_attention", am.multi_head_attention,
               ("x_q", "x_kv", "w_q", "w_k", "w_v", "w_o", "n_heads", "mask"),
               (J.Out("out", "number", "(B, Lq, D)"),), diagnose_mha)


def weights(gen: torch.Generator, D: int, dtype=F32) -> tuple[torch.Tensor, ...]:
    return tuple(cases.randn(gen, D, D, dtype=dtype, scale=1 / math.sqrt(D)) for _ in range(4))


def self_pairs(gen, B: int, L: int, D: int, H: int, kind: str) -> list[Call]:
    """Two self-attention calls that differ only at future positions (``kind``
    "future", causal mask) or only at padded positions ("padding", key padding)."""
    x = cases.randn(gen, B, L, D)
    noise = cases.randn(gen, B, L, D) * 3
    ws = weights(gen, D)
    if kind == "future":
        mask = am.causal_mask(L)
        changed = (torch.arange(L) >= L // 2)[None, :, None]
    else:
        lengths = cases.positive_lengths(gen, B, L)
        lengths[0] = max(1, L - 2)
        real = am.padding_mask(lengths, L)  # (B, L)
        mask = real[:, None, None, :]
        changed = ~real[:, :, None]
    x2 = torch.where(changed, noise, x)
    return [Call((x, x.clone(), *ws, H, mask)), Call((x2, x2.clone(), *ws, H, mask))]


def mha_future_rows(call: Call) -> torch.Tensor:
    L = call.args[0].shape[1]
    return (torch.arange(L) < L // 2)[None, :]  # (1, Lq)


def mha_real_rows(call: Call) -> torch.Tensor:
    return call.args[-1][:, 0, 0, :]  # (B, L)


@exercise(3, "multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None): (B, Lq, D) with "
          "heads of width d = D // n_heads, weights applied as x @ w.T.")
def multi_head_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = MHA
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    x3 = cases.randn(pub, 1, 3, 4)
    checks = [
        J.values(R, "self-attention, causal (B=1, L=3, D=4, H=2)",
                 [Call((x3, x3.clone(), *weights(pub, 4), 2, am.causal_mask(3)))], public=True),
        J.values(R, "cross-attention, no mask (B=2, Lq=2, Lk=3, D=4, H=2)",
                 [Call((cases.randn(pub, 2, 2, 4), cases.randn(pub, 2, 3, 4), *weights(pub, 4), 2))],
                 public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, Lq, Lk = 2, cases.integer(gen, 3, 5), cases.integer(gen, 6, 9)  # B != Lq != Lk
    D, H = 16, [2, 4][cases.integer(gen, 0, 1)]

    def call(dtype=F32, mask="full", D=D, H=H):
        xq, xkv = cases.randn(gen, B, Lq, D, dtype=dtype), cases.randn(gen, B, Lk, D, dtype=dtype)
        m = {"full": lambda: cases.random_mask(gen, B, H, Lq, Lk),
             "keys": lambda: am.padding_mask(cases.positive_lengths(gen, B, Lk), Lk)[:, None, None, :],
             "padded": lambda: am.padding_mask(cases.randint_(gen, (B,), 1, Lk - 1), Lk)[:, None, None, :],
             "square": lambda: cases.random_mask(gen, Lq, Lk) | (torch.arange(Lk) == 0),
             "empty": lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen),
             None: lambda: None}[mask]()
        return Call((xq, xkv, *weights(gen, D, dtype), H) + ((m,) if m is not None else ()))

    def negative(mask: bool) -> Call:
        """D = 8, H = 2 (head width 4), integer inputs and q/k weights: every score is exact in float32
        and below -2e9 (q projections positive, k projections negative; see grader.cases.exact_qk)."""
        xq = cases.randint_(gen, (B, Lq, 8), 1, 4).float() * 2.0**12
        # later keys score higher (their k projections are smaller): the padded keys would win
        xkv = cases.randint_(gen, (B, Lk, 8), 1, 4).float() * torch.arange(Lk, 0, -1)[:, None] * 2.0**12
        w_q = cases.randint_(gen, (8, 8), 1, 3).float()
        w_k = -cases.randint_(gen, (8, 8), 1, 3).float()
        _, _, w_v, w_o = weights(gen, 8)
        w_v = w_v * 2.0**-17  # values of about 1, not 1e5: no cancellation at float32 precision in out
        keys = am.padding_mask(cases.randint_(gen, (B,), 1, Lk - 1), Lk)[:, None, None, :]  # every row padded
        return Call((xq, xkv, w_q, w_k, w_v, w_o, 2) + ((keys,) if mask else ()))

    return checks + [
        J.values(R, "matches reference (B=2, Lq ≠ Lk, random masks)",
                 [call(), call(mask="keys"), call(mask="square"), call(mask=None)]),
        # Each value check calls with and without a mask: an answer wrong on one branch fails most.
        J.values(R, "one head, and one head per feature",
                 [call(H=1, mask="keys"), call(D=8, H=8, mask="keys"), call(H=1, mask=None)]),
        J.values(R, "float16", [call(F16), call(F16, mask="keys"), call(F16, mask=None)]),
        J.values(R, "bfloat16", [call(BF16), call(BF16, mask="keys"), call(BF16, mask=None)]),
        J.values(R, "rows whose every score is below -2e9 (a -1e9 fill outweighs them), with and without "
                 "a mask", [negative(mask=True), negative(mask=False)]),
        J.dtypes(R, "keeps the inputs' dtype", [call(d, mask="keys") for d in cases.FLOATS]),
        Check("future tokens do not change earlier outputs", self_pairs(gen, B, 6, 8, 2, "future"),
              P.pair_judge(R, mha_future_rows, M["future_leak"]), kind="property"),
        Check("padded tokens do not change real outputs", self_pairs(gen, B + 1, 6, 8, 2, "padding"),
              P.pair_judge(R, mha_real_rows, M["padding_leak"]), kind="property"),
        P.gradients(R, "finite gradients, match reference", [call(), call(BF16, mask="keys")]),
        P.unchanged(R, "does not modify inputs", [call()]),
        P.on_cuda(R, "matches on CUDA", [call(F16), call(mask="keys")]),
        J.values(R, "fully masked query rows → zero output", [call(mask="empty"), call(BF16, mask="empty")]),
        J.values(R, "large scores at padded keys", [loud_padding(call(mask="padded"))]),
        P.gradients(R, "finite gradients with a fully masked row", [call(mask="empty")]),
        *P.device_checks(R, "mask omitted or given: made on the inputs' device (meta)",
                    [meta(call(mask=None)), meta(call(mask="keys"))], vectorised=False),
    ]


def meta(c: Call) -> Call:
    return Call(c.args, c.kwargs, "meta")


def loud_padding(c: Call) -> Call:
    """The call with padded key tokens scaled by 1e3, so that their scores dwarf the
    real ones, and every other query token scaled by 1e-3, so that its scores stay
    ordinary (which tells masking after the softmax apart from a stabiliser
    taken over blocked entries)."""
    x_q, x_kv, *rest = c.args
    keys = rest[-1][:, 0, 0, :, None]  # (B, Lk, 1)
    quiet = (torch.arange(x_q.shape[1]) % 2 == 1)[None, :, None]  # (1, Lq, 1)
    return Call((torch.where(quiet, x_q * 1e-3, x_q), torch.where(keys, x_kv, x_kv * 1e3), *rest),
                c.kwargs, c.device)
