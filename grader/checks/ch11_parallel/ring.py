"""Chapter 11's ring: ``zigzag_ring_mask`` and ``ring_attention``, their checks and mistakes;
in chapter 11's package (:mod:`grader.checks.ch11_parallel`).

The W steps of a ring, masked by the student's ``zigzag_ring_mask`` and merged, must equal
full causal attention (:func:`grader.checks.common.merging.ring_judge`, rings of 2 ranks in public
and 3 hidden); ``ring_attention``'s every step is judged, rank by rank
(:func:`grader.checks.common.merging.ring_steps_judge`), on worlds of 1 to 5 ranks.
"""

from __future__ import annotations

import torch

import attnmask as am

from ... import cases
from ... import diagnose as dg
from ...mistakes import MISTAKES
from ...spec import Call, Check, exercise
from ..common import judges as J
from ..common import live_memory as LM
from ..common import merging as MG
from ..common import properties as P
from ..common.inputs import qkv
from .mistakes import MISTAKES11

M = MISTAKES
X = MISTAKES11
F32, F16 = torch.float32, torch.float16
#: (L, world) of the memory checks: one step's scores are (2c, 2c) = (32, 32), the whole (L, L) 64 times
#: that; at world 8 the course's ring peaks at a third of the bound (at world 4, at 0.63: too close)
RING_MEMORY = (256, 8)


# --------------------------------------------------------------------------- zigzag_ring_mask

def step_mask(L: int, world: int, rank: int, src: int, layout: str = "zigzag") -> torch.Tensor:
    """bool (2c, 2c): rank ``rank``'s queries against the keys of rank ``src``, by global position."""
    q = am.shard_positions(L, world, rank, layout)
    k = am.shard_positions(L, world, src, layout)
    return q[:, None] >= k[None, :]


def diagnose_ring(args, kwargs, got, index, dtype) -> str | None:
    L, world, rank, step = args[:4]
    c2 = L // world
    ref = am.zigzag_ring_mask(L, world, rank, step)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["ring_contiguous"], lambda: step_mask(L, world, rank, (rank - step) % world, "contiguous")),
        (X["ring_source_plus"], lambda: step_mask(L, world, rank, (rank + step) % world)),
        (X["ring_contiguous"], lambda: step_mask(L, world, rank, (rank + step) % world, "contiguous")),
        (X["ring_local"], lambda: am.causal_mask(c2)),
        (M["wrong_triangle"], lambda: step_mask(L, world, (rank - step) % world, rank).T),
    ], dtype)


RING = J.Recipe("zigzag_ring_mask", am.zigzag_ring_mask, ("L", "world", "rank", "step"),
                (J.Out("mask", "mask", "(2c, 2c)", lambda a, k: (a[0] // a[1], a[0] // a[1])),),
                diagnose_ring)


def ring_calls(L: int, world: int) -> list[Call]:
    return [Call((L, world, r, s)) for r in range(world) for s in range(world)]


def ring_check(L: int, world: int, public: bool = False) -> Check:
    return Check(f"the {world} ring steps of every rank (L = {L}), masked and merged, equal causal attention",
                 ring_calls(L, world),
                 MG.ring_judge(RING, "the ring steps, masked with your masks and merged, are not full causal "
                                     "attention"), public=public)


@exercise(2.5, "zigzag_ring_mask(L, world, rank, step, *, device=None): bool (2c, 2c), c = L / (2·world); "
          "rank r holds chunks r and 2·world - 1 - r; at step s the keys of rank (r - s) mod world; True "
          "where the query's global position >= the key's.")
def zigzag_ring_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = RING
    gen = cases.generator(seed, "zigzag_ring_mask sizes")
    world = cases.integer(gen, 3, 5)
    L = 2 * world * cases.integer(gen, 1, 3)

    def draw(g):
        return (L, world, cases.integer(g, 0, world - 1), cases.integer(g, 1, world - 1))

    public = [("world = 2, L = 12: rank 0 at step 1", (12, 2, 0, 1)),
              ("world = 1 (one rank: plain causal)", (6, 1, 0, 0))]
    edges = [("step 0 (the rank's own keys)", (L, world, 1, 0))]
    checks = P.int_mask_checks(R, seed, hidden, public, edges, draw) + [
        J.values(R, "world = 4, L = 16: rank 1 at steps 1, 2, 3", [Call((16, 4, 1, s)) for s in (1, 2, 3)],
                 public=True),
        ring_check(8, 2, public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((10, 2, 0, 0)), Call((8, 2, 2, 0)), Call((8, 2, 0, 2)), Call((8, 2, -1, 0))],
                 "2·world must divide L, and 0 <= rank, step < world"),
    ]
    if not hidden:
        return checks
    far = 2**20  # world: chunks of 16 whose late halves lie past 2**24, where float32 skips integers
    return checks + [
        J.values(R, "every step of the last rank (random world and L)",
                 [Call((L, world, world - 1, s)) for s in range(world)]),
        ring_check(2 * 3 * cases.integer(gen, 1, 2), 3),
        J.values(R, "positions past 2**24 (L = 2**25, world = 2**20): integer positions, not float32",
                 [Call((32 * far, far, cases.integer(gen, 0, far - 1), 0)),
                  Call((32 * far, far, cases.integer(gen, 0, far - 1), 1))]),
        J.raises(R.name, R.arg_names, "a negative step, L < 1 and world < 1 raise ValueError",
                 [Call((L, world, 0, -1)), Call((0, world, 0, 0)), Call((-L, world, 0, 0)),
                  Call((L, 0, 0, 0))],
                 "L >= 1, world >= 1, and 0 <= rank, step < world"),
    ]


# --------------------------------------------------------------------------- ring_attention

RING_ATT = J.Recipe("ring_attention", am.ring_attention, ("q", "k", "v", "world", "layout"),
                    (J.Out("out", "number", "(B, H, L, dv)"), J.Out("lse", "logsumexp", "(B, H, L)")))


def ring_case(gen, world: int, layout: str, B: int = 1, c: int = 1, dtype=F32) -> Call:
    L = 2 * world * c
    return Call((*qkv(gen, B, 2, L, L, 4, 3, dtype), world, layout))


def ring_steps(name: str, calls: list[Call], public: bool = False, edge: bool = False) -> Check:
    """``edge``: one rank, whose one step is plain causal attention (one pass passes it)."""
    return Check(name, calls, MG.ring_steps_judge(RING_ATT.name, RING_ATT.arg_names), public=public,
                 kind="edge" if edge else "value")


@exercise(5, "ring_attention(q, k, v, world, layout='zigzag'): (out (B, H, L, dv), lse (B, H, L), steps): "
          "causal attention computed on a simulated ring of `world` ranks; steps[r] lists, in ring order, "
          "the (out_s, lse_s) of each step rank r ran (its local queries over the shard it held alone; "
          "all-False steps skipped), merged with your merge_partials; the floating tensors it holds alive "
          "at once stay below half of the B·H·L·L scores, and none it creates is as large as half of one "
          "rank's queries against every key.")
def ring_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = RING_ATT
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        ring_steps("world = 2, L = 8, zigzag: out, lse and every rank's steps",
                   [ring_case(pub, 2, "zigzag", c=2)], public=True),
        ring_steps("world = 2, L = 8, contiguous: rank 0 skips the step holding rank 1's shard",
                   [ring_case(pub, 2, "contiguous", c=2)], public=True),
        ring_steps("world = 4, both layouts (B = 2, L = 8)",
                   [ring_case(pub, 4, "zigzag", B=2), ring_case(pub, 4, "contiguous", B=2)], public=True),
        J.raises(R.name, R.arg_names, "bad sizes or layout raise ValueError",
                 [Call((*qkv(pub, 1, 1, 6, 6, 2, 2), 2, "zigzag")),
                  Call((*qkv(pub, 1, 1, 8, 8, 2, 2), 2, "diagonal"))],
                 "2·world must divide L, and layout is 'zigzag' or 'contiguous'"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    c = cases.integer(gen, 1, 2)
    B = cases.integer(gen, 1, 2)
    # The two memory checks judge the same calls: the worker makes them once (worker._run_exercise).
    memory = [Call((*qkv(gen, 1, 2, RING_MEMORY[0], RING_MEMORY[0], 2, 2), RING_MEMORY[1], layout),
                   allocations=True) for layout in ("zigzag", "contiguous")]
    return checks + [
        ring_steps("world = 3, zigzag and contiguous (random B, L)",
                   [ring_case(gen, 3, "zigzag", B, c), ring_case(gen, 3, "contiguous", B, c)]),
        ring_steps("world = 5, zigzag and contiguous (random B, L)",
                   [ring_case(gen, 5, "zigzag", B, c), ring_case(gen, 5, "contiguous", B, c)]),
        ring_steps("world = 5, layout left out (zigzag by default)",
                   [Call((*qkv(gen, B, 2, 10 * c, 10 * c, 4, 3), 5))]),
        ring_steps("float16 q, k, v (world = 3, zigzag): out in float16, lse in float32",
                   [ring_case(gen, 3, "zigzag", B, c, dtype=F16)]),
        ring_steps("world = 1: one rank, one step (plain causal)", [ring_case(gen, 1, "zigzag", B, 2)],
                   edge=True),
        P.unchanged(R, "does not modify inputs", [ring_case(gen, 3, "zigzag", B, c)]),
        Check("on the inputs' device (meta), layout left out",
              [Call(ring_case(gen, 3, "zigzag", B, c).args[:4], device="meta")],
              MG.ring_device_judge(R.name, R.arg_names), kind="property"),
        P.made_on_inputs_device(R, P.MADE_ON_INPUTS, [Call(ring_case(gen, 3, "zigzag", B, c).args[:4])],
                                MG.ring_default_device_judge(R.name, R.arg_names)),
        # A rank sees its shard: the ring never holds the (L, L) scores, so full causal attention in one
        # call beside correct steps holds over half of them and loses more than half the points here.
        Check(f"holds less than half of the (L, L) scores alive at once (B=1, H=2, L={RING_MEMORY[0]}, "
              f"d=dv=2, world={RING_MEMORY[1]}, both layouts)",
              memory, LM.live_memory_judge(R, X["ring_one_pass"]), kind="property", weight=12.0),
        # ... and each of its steps meets one shard: out and lse from each rank's queries against all L
        # keys (no merge at all) stay under the live bound, and hold a tensor of L / world rows by L.
        Check(f"each step reads one shard: no tensor of a rank's queries against all keys (B=1, H=2, "
              f"L={RING_MEMORY[0]}, d=dv=2, world={RING_MEMORY[1]}, both layouts)",
              memory, LM.one_shard_judge(R, X["ring_all_keys"]), kind="property", weight=28.0),
        Check("matches on CUDA (world = 3, both layouts)",
              [Call(x.args, device=dev)
               for x in (ring_case(gen, 3, "zigzag", B, c), ring_case(gen, 3, "contiguous"))
               for dev in ("cuda", "cpu")],
              MG.ring_steps_judge(R.name, R.arg_names), requires="cuda"),
    ]
