"""Chapter 6, KV-cache decoding: ``kv_cache_attention``."""

from __future__ import annotations

import math

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .ch2_softmax import global_max
from .common import judges as J
from .common import properties as P

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def cache_mistakes(q, k_new, v_new, k_cache, v_cache, index) -> list[dg.Candidate]:
    n, T, d = q.shape[2], k_cache.shape[2], q.shape[-1]
    k_all, v_all = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    if index > 0:
        return [("the cache goes first: k_all is the cache followed by the new keys along the positions "
                 "axis, so positions stay in order.",
                 lambda: (None, torch.cat([k_new, k_cache], 2), torch.cat([v_new, v_cache], 2)))]
    causal = am.causal_mask(n, n_keys=T + n)  # (n, T + n), bottom-right
    att = lambda mask, **kw: am.attention(q, k_all, v_all, mask, **kw)[0]  # noqa: E731
    return [
        (M["top_left"], lambda: att(am.causal_mask(n, n_keys=T + n, align="top_left"))),
        ("the new tokens see each other's future: with several new tokens, query i may see the keys up to "
         "T + i only (a causal mask aligned bottom-right).", lambda: att(None)),
        ("the cache is ignored: the new queries must attend to the cached keys too (cat them first).",
         lambda: am.attention(q, k_new, v_new, am.causal_mask(n))[0]),
        (M["inverted"], lambda: att(~causal)),
        (M["no_scale"], lambda: att(causal, scale=1.0)),
        (M["scale_1_over_d"], lambda: att(causal, scale=1.0 / d)),
        ("the scale is off: use one over sqrt(d), d the width of one head.",
         lambda: att(causal, scale=1 / math.sqrt(T + n))),
        (M["global_max"], lambda: global_max(q @ k_all.mT / math.sqrt(d), causal).nan_to_num(0.0) @ v_all),
    ]


def diagnose_cache(args, kwargs, got, index, dtype) -> str | None:
    return dg.name_mistake(got, cache_mistakes(*args, index), dtype, index)


CACHE = J.Recipe(
    "kv_cache_attention", am.kv_cache_attention, ("q", "k_new", "v_new", "k_cache", "v_cache"),
    (J.Out("out", "number", "(B, H, n, d)"), J.Out("k_all", "number", "(B, H, T + n, d)"),
     J.Out("v_all", "number", "(B, H, T + n, d)")),
    diagnose_cache,
)


def qkv(gen, B, H, n, T, d, dtype=F32) -> tuple[torch.Tensor, ...]:
    new = [cases.randn(gen, B, H, n, d, dtype=dtype) for _ in range(3)]
    return (*new, cases.randn(gen, B, H, T, d, dtype=dtype), cases.randn(gen, B, H, T, d, dtype=dtype))


def negative_qkv(gen, B, H, n, T) -> tuple[torch.Tensor, ...]:
    """(q, k_new, v_new, k_cache, v_cache) of head width 4 whose every score is exact in float32 and
    below -2e9 (:func:`grader.cases.exact_qk`)."""
    q, k = cases.exact_qk(gen, (B, H, n, cases.EXACT_D), (B, H, T + n, cases.EXACT_D), "negative")
    v = cases.randn(gen, B, H, T + n, cases.EXACT_D)
    return q, k[:, :, T:].clone(), v[:, :, T:].clone(), k[:, :, :T].clone(), v[:, :, :T].clone()


def decoding_calls(gen, B: int, H: int, L: int, d: int) -> list[Call]:
    """One full pass over L tokens with an empty cache, then the same sequence
    decoded as: one token at a time, and a chunk of 3 after a prefix of 2. Each
    call is given the cache it would have had."""
    q, k, v = (cases.randn(gen, B, H, L, d) for _ in range(3))

    def step(start: int, stop: int) -> Call:
        # clone: each call owns its tensors (views would ship the whole storage)
        new = tuple(t[:, :, start:stop].clone() for t in (q, k, v))
        return Call((*new, k[:, :, :start].clone(), v[:, :, :start].clone()))

    return [step(0, L)] + [step(t, t + 1) for t in range(L)] + [step(2, 5)]


def future_rows(call: Call) -> torch.Tensor:
    n = call.args[0].shape[2]
    return torch.arange(n) < n // 2  # (n,)


def chunk_pairs(gen, B, H, n, T, d) -> list[Call]:
    """Two calls with the same cache whose new tokens differ from n // 2 on."""
    a = qkv(gen, B, H, n, T, d)
    b = tuple(t.clone() for t in a)
    for t in b[:3]:
        t[:, :, n // 2:] = cases.randn(gen, B, H, n - n // 2, d) * 3
    return [Call(a), Call(b)]


@exercise(3, "kv_cache_attention(q, k_new, v_new, k_cache, v_cache): n new tokens attend the cache and "
          "themselves (query i sees keys 0 .. T + i); returns (out, k_all, v_all).")
def kv_cache_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = CACHE
    public = [("one new token, cache of T=3 (d=2)", (1, 1, 1, 3, 2)),  # (B, H, n, T, d)
              ("empty cache T=0, n=3 new tokens", (1, 1, 3, 0, 2))]
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [J.values(R, name, [Call(qkv(pub, *dims))], public=True) for name, dims in public]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d = 2, cases.integer(gen, 1, 3), cases.integer(gen, 2, 6)
    n, T = cases.integer(gen, 3, 4), cases.integer(gen, 5, 7)  # B != n != T
    return checks + [
        J.values(R, "chunk of new tokens (B=2, n > 1, T > 0)", [Call(qkv(gen, B, H, n, T, d))]),
        Check("step by step equals the full pass", decoding_calls(gen, B, H, 6, d),
              P.decoding_judge(R), kind="property"),
        Check("later new tokens do not change earlier ones", chunk_pairs(gen, B, H, 4, T, d),
              P.pair_judge(R, future_rows, M["future_leak"], only=(0,)), kind="property"),
        J.values(R, "float16", [Call(qkv(gen, B, H, n, T, d, F16))]),
        J.values(R, "bfloat16", [Call(qkv(gen, B, H, n, T, d, BF16))]),
        J.dtypes(R, "keeps the inputs' dtype", [Call(qkv(gen, B, H, n, T, d, dt)) for dt in cases.FLOATS]),
        P.gradients(R, "finite gradients, match reference", [Call(qkv(gen, B, H, n, T, d))]),
        P.unchanged(R, "does not modify inputs", [Call(qkv(gen, B, H, n, T, d))]),
        *P.device_checks(R, "runs on the inputs' device (meta)",
                         [Call(qkv(gen, B, H, n, T, d), device="meta")]),
        P.on_cuda(R, "matches on CUDA", [Call(qkv(gen, B, H, n, T, d, F16)), Call(qkv(gen, B, H, n, 0, d))]),
        J.values(R, "large scores at the future new keys", [Call(loud_future(*qkv(gen, B, H, n, T, d)))]),
        J.values(R, "rows whose every score is below -2e9 (a -1e9 fill outweighs them)",
                 [Call(negative_qkv(gen, B, H, n, T))]),
    ]


def loud_future(q, k_new, v_new, k_cache, v_cache):
    """Inputs where the last new key scores hundreds of times more than any other
    for every query but the last, which sees it (and whose q is scaled by 1e-3 to
    keep its scores ordinary): a softmax stabilised over blocked entries too
    underflows the allowed weights of the other queries."""
    n = q.shape[2]
    last = (torch.arange(n) == n - 1)[:, None]  # (n, 1)
    q = torch.where(last, q.abs() * 1e-3, q.abs())
    return q, torch.where(last, k_new.abs() + 300.0, k_new), v_new, k_cache, v_cache
