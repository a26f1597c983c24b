"""Timing chapter 13's kernels, and the class leaderboard built from recorded timings.

:func:`time_kernels` times a forward and a backward launcher (the exercise's signatures) on one
fixed case: a causal mask over ``(B, H, L, d)`` with its tile lists. On a GPU that is
:data:`GPU_SIZE`, the size timings are compared at; :func:`reference_timings` times the course's
own kernels and, where CUDA and ``torch.compile`` are there, FlexAttention on the same mask. In
Triton's CPU interpreter the same harness runs at :data:`TINY_SIZE` (what the tests do): its
numbers say nothing about speed, only that the harness works.

:func:`leaderboard` turns recorded timings (one dict per student: ``name``, ``forward_ms``,
``backward_ms``, and ``correct``) into a Markdown table ranked by forward + backward time, and
:func:`leaderboard_figure` draws them. Only correct submissions are ranked: a fast wrong kernel
is listed below the ranking, unranked. Nothing here asserts a speed.

Student kernels are timed only where they already run (their own machine, or a class run's
worker); this module never loads a submission.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Size:
    B: int
    H: int
    L: int
    d: int
    tile: int


#: Where timings are compared: one size for the whole class, on a GPU.
GPU_SIZE = Size(B=4, H=8, L=2048, d=64, tile=64)
#: The interpreter's size: seconds per call on a CPU, enough to exercise the harness.
TINY_SIZE = Size(B=1, H=1, L=32, d=4, tile=16)


def case(size: Size, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
    """(q, k, v, mask, *tile lists) of a causal mask at ``size``, and d_out for the backward."""
    from attnmask.kernels import tile_lists_of

    gen = torch.Generator().manual_seed(seed)
    B, H, L, d = size.B, size.H, size.L, size.d
    q, k, v, d_out = (torch.randn(B, H, L, d, generator=gen).to(device, dtype) for _ in range(4))
    mask = torch.ones(L, L, dtype=torch.bool).tril().expand(B, H, L, L).contiguous().to(device)
    return (q, k, v, mask, *tile_lists_of(mask, size.tile)), d_out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], device: str, repeats: int = 5, warmup: int = 1) -> float:
    """The median wall time of ``fn()`` in milliseconds, after ``warmup`` calls (compilation)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_kernels(forward, backward, size: Size = GPU_SIZE, device: str = "cuda", repeats: int = 5,
                 dtype: torch.dtype = torch.float16) -> dict[str, float]:
    """``{"forward_ms", "backward_ms"}`` of the launchers ``forward(q, k, v, mask, *lists,
    tile=...)`` and ``backward(q, k, v, out, lse, d_out, mask, *lists, tile=...)`` at ``size``."""
    args, d_out = case(size, device, dtype)
    q, k, v, mask, *lists = args
    out, lse = forward(*args, tile=size.tile)
    fwd = median_ms(lambda: forward(*args, tile=size.tile), device, repeats)
    bwd = median_ms(lambda: backward(q, k, v, out, lse, d_out, mask, *lists, tile=size.tile), device, repeats)
    return {"forward_ms": fwd, "backward_ms": bwd}


def reference_timings(size: Size = GPU_SIZE, device: str = "cuda", repeats: int = 5) -> dict[str, dict]:
    """The course's kernels and, on CUDA, FlexAttention (compiled, its BlockMask from the same
    causal mask, the same tile as both block sizes) at ``size``: what students are compared with."""
    from attnmask.kernels import block_sparse_backward, block_sparse_forward

    out = {"course": time_kernels(block_sparse_forward, block_sparse_backward, size, device, repeats)}
    if device.startswith("cuda"):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        args, d_out = case(size, device, torch.float16)
        q, k, v = (t.requires_grad_(True) for t in args[:3])
        block = create_block_mask(lambda b, h, i, j: j <= i, size.B, size.H, size.L, size.L, device=device,
                                  BLOCK_SIZE=size.tile)
        flex = torch.compile(flex_attention)
        fwd = median_ms(lambda: flex(q, k, v, block_mask=block), device, repeats)
        result = flex(q, k, v, block_mask=block)
        bwd = median_ms(lambda: torch.autograd.grad(result, (q, k, v), d_out, retain_graph=True), device,
                        repeats)
        out["flex_attention"] = {"forward_ms": fwd, "backward_ms": bwd}
    return out


# --------------------------------------------------------------------------- the leaderboard

def ranked(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(the correct records by forward + backward time, fastest first; the others by name)."""
    def total(r):
        return r["forward_ms"] + r["backward_ms"]

    good = [r for r in records if r.get("correct") and all(math.isfinite(r[k]) for k in ("forward_ms",
                                                                                            "backward_ms"))]
    rest = sorted((r for r in records if r not in good), key=lambda r: r["name"])
    return sorted(good, key=lambda r: (total(r), r["name"])), rest


def leaderboard(records: Sequence[dict], references: dict[str, dict] | None = None) -> str:
    """A Markdown table: rank, name, forward, backward and total in ms, and the ratio to the course's
    kernel when ``references`` has it; unranked (wrong) submissions after the ranked ones."""
    good, rest = ranked(records)
    base = (references or {}).get("course")
    lines = ["| rank | name | forward (ms) | backward (ms) | total (ms) | vs course |",
             "|---:|---|---:|---:|---:|---:|"]
    for what, r in [*(("ref", {"name": f"*{n}*", **t}) for n, t in (references or {}).items())]:
        lines.append(f"| {what} | {r['name']} | {r['forward_ms']:.3f} | {r['backward_ms']:.3f} | "
                     f"{r['forward_ms'] + r['backward_ms']:.3f} | |")
    for i, r in enumerate(good, start=1):
        total = r["forward_ms"] + r["backward_ms"]
        ratio = f"{total / (base['forward_ms'] + base['backward_ms']):.2f}x" if base else ""
        lines.append(f"| {i} | {r['name']} | {r['forward_ms']:.3f} | {r['backward_ms']:.3f} | {total:.3f} | "
                     f"{ratio} |")
    for r in rest:
        lines.append(f"| – | {r['name']} | | | | not ranked: not correct |")
    return "\n".join(lines) + "\n"


def leaderboard_figure(records: Sequence[dict], path: Path,
                       references: dict[str, dict] | None = None) -> Path:
    """A horizontal bar chart of the ranked submissions' forward and backward times, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good, _ = ranked(records)
    rows = [{"name": n, **t} for n, t in (references or {}).items()] + list(good)
    names = [r["name"] for r in rows]
    fwd = [r["forward_ms"] for r in rows]
    bwd = [r["backward_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.5))
    ax.barh(names, fwd, label="forward")
    ax.barh(names, bwd, left=fwd, label="backward")
    ax.invert_yaxis()
    ax.set_xlabel("time (ms), median of repeated runs")
    ax.set_title("Chapter 13 kernels: forward + backward at one fixed size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
