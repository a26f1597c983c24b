"""Chapter 11's ``cascade_attention``: a shared prefix attended once for N decoding queries,
merged with each sequence's own suffix. Its checks and mistakes; in chapter 11's package
(:mod:`grader.checks.ch11_parallel`).
"""

from __future__ import annotations

import torch

import attnmask as am

from ... import cases
from ... import diagnose as dg
from ...spec import Call, Check, exercise
from ..common import judges as J
from ..common import merging as MG
from ..common import properties as P
from .mistakes import MISTAKES11

X = MISTAKES11
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


# --------------------------------------------------------------------------- cascade_attention

def _cascade_parts(args):
    """(prefix (out, lse), suffix masked (out, lse), suffix unmasked (out, lse)), float64, (N, H, .)."""
    q, pk, pv, sk, sv, n = args[:6]
    S = sk.shape[2]
    qq = q.double().transpose(0, 1)[None]  # (1, H, N, d)
    P_ = MG.attend64(qq, pk.double()[None], pv.double()[None], torch.ones(1, dtype=torch.bool))
    prefix = (P_[0][0].transpose(0, 1), P_[1][0].transpose(0, 1))
    real = (torch.arange(S)[None, :] < n[:, None])[:, None, None, :]  # (N, 1, 1, S)
    own = MG.attend64(q.double()[:, :, None], sk, sv, real)
    loose = MG.attend64(q.double()[:, :, None], sk, sv, torch.ones_like(real))
    return prefix, (own[0][:, :, 0], own[1][:, :, 0]), (loose[0][:, :, 0], loose[1][:, :, 0])


def diagnose_cascade(args, kwargs, got, index, dtype) -> str | None:
    prefix, own, loose = _cascade_parts(args)
    q = args[0]
    N, H, d = q.shape

    def reshaped():
        qq = q.double().reshape(1, H, N, d)
        everything = torch.ones(1, dtype=torch.bool)
        o, s = MG.attend64(qq, args[1].double()[None], args[2].double()[None], everything)
        return MG.merge64(o[0].reshape(N, H, -1), s[0].reshape(N, H), *own)

    return dg.name_mistake(got, [
        (X["cascade_suffix_unmasked"], lambda: MG.merge64(*prefix, *loose)),
        (X["cascade_pairs_mixed"], lambda: MG.merge64(prefix[0], own[1], own[0], prefix[1])),
        (X["cascade_reshape"], reshaped),
        (X["merge_average"], lambda: ((prefix[0] + own[0]) / 2, MG.merge64(*prefix, *own)[1])),
    ], dtype, index)


CASCADE = J.Recipe("cascade_attention", am.cascade_attention,
                   ("q", "prefix_k", "prefix_v", "suffix_k", "suffix_v", "suffix_lengths"),
                   (J.Out("out", "number", "(N, H, dv)"), J.Out("lse", "logsumexp", "(N, H)")),
                   diagnose_cascade)


def cascade_case(gen, N: int, H: int, P_: int, S: int, d: int = 4, dv: int = 3, dtype=F32,
                 lengths: torch.Tensor | None = None) -> tuple:
    return (cases.randn(gen, N, H, d, dtype=dtype), cases.randn(gen, H, P_, d, dtype=dtype),
            cases.randn(gen, H, P_, dv, dtype=dtype), cases.randn(gen, N, H, S, d, dtype=dtype),
            cases.randn(gen, N, H, S, dv, dtype=dtype),
            cases.lengths(gen, N, S) if lengths is None else lengths)


@exercise(4, "cascade_attention(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths): (out (N, H, dv), "
          "lse (N, H)): one decoding query per sequence (q (N, H, d)) over a shared prefix (H, P, d) "
          "attended once for all N queries and its own suffix (N, H, S, d) whose first suffix_lengths[n] "
          "keys are real, merged with your merge_partials.")
def cascade_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = CASCADE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "N = 3 sequences, H = 2, prefix of 5, suffixes of 2, 0 and 4 real keys (of S = 4)",
                 [Call(cascade_case(pub, 3, 2, 5, 4, lengths=torch.tensor([2, 0, 4])))], public=True),
        J.raises(R.name, R.arg_names, "shapes that do not fit, or lengths outside 0 .. S, raise ValueError",
                 [Call(cascade_case(pub, 2, 2, 3, 2, lengths=torch.tensor([1, 3]))),
                  Call((*cascade_case(pub, 2, 2, 3, 2)[:3], *cascade_case(pub, 3, 2, 3, 2)[3:]))],
                 "q (N, H, d), prefix (H, P, d|dv), suffix (N, H, S, d|dv), 0 <= suffix_lengths <= S"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    N, H = cases.integer(gen, 3, 6), cases.integer(gen, 1, 3)
    P_, S = cases.integer(gen, 4, 9), cases.integer(gen, 2, 5)
    x = lambda dtype=F32, scale=1.0: cascade_case(gen, N, H, P_, S, dtype=dtype)  # noqa: E731
    big = cascade_case(gen, 12, 2, 32, 3)
    return checks + [
        J.values(R, "random N, H, P, S; a sequence with no suffix key and one with all S",
                 [Call(x()), Call(x())]),
        J.values(R, "every suffix full; dv != d", [Call(cascade_case(gen, N, H, P_, S, d=4, dv=6,
                                                                     lengths=torch.full((N,), S)))]),
        J.values(R, "large scores (≈ 1e3) in the prefix and the suffixes",
                 [Call(tuple(t * 12 if t.dtype.is_floating_point and i in (0, 1, 3) else t
                             for i, t in enumerate(x())))]),
        J.values(R, "float16 (lse in float32)", [Call(x(F16))]),
        J.values(R, "bfloat16 (lse in float32)", [Call(x(BF16))]),
        J.dtypes(R, "out in q's dtype, lse float32", [Call(x(dt)) for dt in cases.FLOATS]),
        P.unchanged(R, "does not modify inputs", [Call(x())]),
        *P.device_checks(R, "on the inputs' device (meta)", [Call(x(), device="meta")], vectorised=False),
        P.on_cuda(R, "matches on CUDA", [Call(x()), Call(x(F16))]),
        # The prefix read once is the exercise: it outweighs every other check together (a per-sequence
        # loop, or the prefix copied per sequence, loses more than half the points).
        Check("reads the prefix once: N = 12 queries, P = 32 prefix keys, d = 4",
              [Call(big, allocations=True)],
              MG.prefix_once_judge(R.name, R.arg_names, X["cascade_per_sequence"],
                                   X["cascade_prefix_copied"]),
              kind="property", weight=12.0),
    ]
