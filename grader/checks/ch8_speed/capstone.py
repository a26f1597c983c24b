"""Chapter 8's capstone, ``tiled_attention_fn``: exercises 8.1 and 8.2 as one
``torch.autograd.Function``. Its checks; in chapter 8's package (:mod:`grader.checks.ch8_speed`).

Besides the output and the gradients (both attention's), one check holds it to the method: over the
forward and the backward together, the floating tensors alive at once stay below half of the
B·H·Lq·Lk score matrix (:mod:`grader.checks.common.live_memory`). Between the passes only ``out`` and
``lse`` may be kept; autograd through a differentiable tiled forward keeps every tile's weights,
and a backward by autograd through dense attention builds the whole matrix: both cross it.
"""

from __future__ import annotations

import torch

import attnmask as am

from ... import cases
from ...cases import with_empty_row
from ...spec import Call, Check, exercise
from ..common import judges as J
from ..common import live_memory as LM
from ..common import properties as P
from ..common.inputs import MEMORY, exact_qkv, first_tile_blocked, qkv

F32 = torch.float32

#: What the memory check's failure means for this exercise.
KEPT_WEIGHTS = ("the weights are kept between the forward and the backward pass (or the backward builds them "
                "whole): at one moment the floating tensors created by the forward and the backward together "
                "added up to half of the B·H·Lq·Lk weights or more. Compute out and lse with your tiled loop "
                "under the Function's forward (no autograd graph there), save only q, k, v, out and lse with "
                "ctx.save_for_backward, and return your tiled_attention_backward's gradients from backward.")

FN = J.Recipe("tiled_attention_fn", am.tiled_attention_fn, ("q", "k", "v", "mask", "tile"),
              (J.Out("out", "number", "(B, H, Lq, dv)"),))


@exercise(2.5, "tiled_attention_fn(q, k, v, mask=None, tile=64): out (B, H, Lq, dv), attention's output "
          "from a torch.autograd.Function whose forward is the tiled loop of 8.1 (also giving the lse) "
          "and whose backward is 8.2's tiled_attention_backward from the saved out and lse; gradients "
          "equal dense attention's; forward and backward together hold less than half of the B·H·Lq·Lk "
          "weights at once.")
def tiled_attention_fn_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = FN
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    heads = with_empty_row(cases.random_mask(pub, 1, 2, 3, 8), pub)
    checks = [
        J.values(R, "matches attention (B=1, H=2, Lq=3, Lk=8, tile=4), a fully masked row",
                 [Call((*qkv(pub, 1, 2, 3, 8, 4, 2), heads), {"tile": 4})], public=True),
        P.gradients(R, "gradients in q, k and v match attention's (tile=3 does not divide Lk=7)",
                    [Call((*qkv(pub, 1, 2, 4, 7, 4, 2), cases.two_keys_or_none(
                        with_empty_row(cases.random_mask(pub, 1, 2, 4, 7), pub))), {"tile": 3})],
                    public=True),
        P.unchanged(R, "does not modify inputs", [Call((*qkv(pub, 1, 2, 3, 8, 4, 2), heads), {"tile": 4})]),
        # The Function is the exercise: autograd through a differentiable tiled forward, or a backward by
        # autograd, gives the same numbers and holds the weights; the rule outweighs the other checks.
        Check(f"forward and backward hold less than half of the weights alive at once (B=1, H=2, "
              f"Lq={MEMORY[2]}, Lk={MEMORY[3]}, tile=4)",
              [Call((*qkv(pub, *MEMORY), cases.random_mask(pub, 1, 1, *MEMORY[2:4], p=0.8)), {"tile": 4},
                    allocations=True)],
              LM.live_memory_judge(R, KEPT_WEIGHTS), want_grads=True, kind="property", weight=12.0),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 3, 5), cases.integer(gen, 9, 13)
    tile = cases.integer(gen, 2, 4)
    if Lk % tile == 0:
        Lk += 1  # a partial last tile
    x = lambda dtype=F32: qkv(gen, B, H, Lq, Lk, d, dv, dtype)  # noqa: E731
    per_head = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    shared = lambda: with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk), gen)  # noqa: E731
    return checks + [
        J.values(R, "matches reference (B=2, per-head and (Lq, Lk) masks, no mask, tile not dividing Lk)",
                 [Call((*x(), per_head()), {"tile": tile}),
                  Call((*x(), with_empty_row(cases.random_mask(gen, Lq, Lk), gen)), {"tile": tile}),
                  Call(x(), {"tile": tile})]),
        P.gradients(R, "gradients match attention's: per-head masks with fully masked rows, no mask",
                    [Call((*x(), cases.two_keys_or_none(per_head())), {"tile": tile}),
                     Call(x(), {"tile": tile})]),
        P.gradients(R, "gradients match attention's: rows whose first tile is fully masked, tile = 1",
                    [Call((*x(), cases.two_keys_or_none(first_tile_blocked(gen, B, H, Lq, Lk, tile))),
                          {"tile": tile}),
                     Call((*x(), cases.two_keys_or_none(per_head())), {"tile": 1})]),
        J.values(R, "large scores next to masked keys (≈ 1e5)",
                 [Call((*exact_qkv(gen, B, H, Lq, Lk, dv, "large"), per_head()), {"tile": tile})]),
        J.values(R, "float16 and bfloat16, with a fully masked row",
                 [Call((*x(dt), shared()), {"tile": tile}) for dt in (torch.float16, torch.bfloat16)]),
        *P.device_checks(R, "on the inputs' device (meta), with and without a mask",
                    [Call(x(), device="meta"), Call((*x(), shared()), {"tile": tile}, device="meta")],
                    vectorised=False),
        P.on_cuda(R, "matches on CUDA", [Call((*x(), per_head()), {"tile": tile})]),
    ]
