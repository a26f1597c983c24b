"""Ring attention on W CPU processes with ``torch.distributed`` (gloo), checked against full causal attention.

    python scripts/ring_attention.py --world 4 --length 32            # zigzag sharding
    python scripts/ring_attention.py --world 4 --length 32 --layout contiguous

The same algorithm as :func:`attnmask.ring_attention`, run for real: W processes, one
per rank, each given only the 2c = L / W tokens of its own shard (``attnmask.shard_positions``):
the parent writes one file per rank, and rank r reads only its own. At step s a rank
attends the key/value shard it holds, that of rank (rank - s) mod W, masked by global
position (``attnmask.ring_step_mask``), and merges the result into its running
``(out, lse)`` (``attnmask.merge_partials``). The transfer of the next shard (send to
rank + 1, receive from rank - 1, ``dist.batch_isend_irecv``) is started *before* that
step's attention and waited for after it: communication overlaps computation, which is
the point of a ring. A step whose mask is all False is skipped, as a kernel skips it, but
its shard still travels. Rank 0 gathers the outputs and puts them back in global order.

The processes meet through a file (``file://`` init in a temporary folder): no port is
opened, so runs never collide. Prints the largest difference from
``attnmask.attention_lse`` over all keys with a causal mask, and how many ring steps
each rank computed; exits 1 when the difference exceeds the float32 tolerance.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnmask as am

#: float32 tolerance of the comparison with one-pass attention
ATOL = 1e-5


def rank_main(rank: int, world: int, folder: str, layout: str) -> None:
    """One rank: read its own shard, run the ring, send (out, lse, steps computed) to rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        # only this rank's tokens: (B, H, 2c, d), (B, H, 2c, d), (B, H, 2c, dv), and the length L
        q_r, k_r, v_r, L = torch.load(Path(folder) / f"shard{rank}.pt")
        kv = torch.cat([k_r, v_r], dim=-1).contiguous()  # (B, H, 2c, d + dv): one message per step
        d = k_r.shape[-1]
        out = lse = None
        computed = 0
        for step in range(world):
            pending, incoming = [], None
            if step < world - 1:  # start passing the shard on (and taking the previous rank's) first ...
                incoming = torch.empty_like(kv)
                pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                                  dist.P2POp(dist.irecv, incoming, (rank - 1) % world)])
            mask = am.ring_step_mask(L, world, rank, step, layout)  # (2c, 2c), by global position
            if bool(mask.any()):  # ... and compute while the next shard travels
                part = am.attention_lse(q_r, kv[..., :d], kv[..., d:], mask)
                out, lse = part if out is None else am.merge_partials(out, lse, *part)
                computed += 1
            for req in pending:
                req.wait()
            if incoming is not None:
                kv = incoming
        # the diagonal step always has allowed keys, so out and lse exist
        gathered = [None] * world if rank == 0 else None
        dist.gather_object((out, lse, computed), gathered, dst=0)
        if rank == 0:
            torch.save(gathered, Path(folder) / "result.pt")
    finally:
        dist.destroy_process_group()


def run_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int, layout: str = "zigzag"
             ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Causal attention of ``q, k, v (B, H, L, d|dv)`` on ``world`` gloo processes.

    Returns:
        ``(out (B, H, L, dv), lse (B, H, L), steps)``: the ring's result in global order, and how many
        of the ``world`` ring steps each rank computed (the others were fully masked).
    """
    L = q.shape[-2]
    if L % (2 * world):
        raise ValueError(f"L = {L} must be divisible by 2·world = {2 * world}")
    with tempfile.TemporaryDirectory() as folder:
        for r in range(world):  # each rank gets a file with its own shard only
            mine = am.shard_positions(L, world, r, layout)
            torch.save((q[..., mine, :].clone(), k[..., mine, :].clone(), v[..., mine, :].clone(), L),
                       Path(folder) / f"shard{r}.pt")
        # fork where it exists: the ranks start in a fraction of a second instead of importing torch anew
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        mp.start_processes(rank_main, args=(world, folder, layout), nprocs=world, join=True,
                           start_method=method)
        parts = torch.load(Path(folder) / "result.pt", weights_only=False)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32)
    for r, (o, s, _) in enumerate(parts):
        mine = am.shard_positions(L, world, r, layout)
        out[..., mine, :], lse[..., mine] = o, s
    return out, lse, [n for _, _, n in parts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4, help="ranks W (processes)")
    parser.add_argument("--length", type=int, default=32, help="sequence length L, divisible by 2·W")
    parser.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(1, 2, args.length, 8, generator=gen) for _ in range(3))
    out, lse, steps = run_ring(q, k, v, args.world, args.layout)
    want_out, want_lse = am.attention_lse(q, k, v, am.causal_mask(args.length))
    err = max(float((out - want_out).abs().max()), float((lse - want_lse).abs().max()))
    same = err <= ATOL
    print(f"{args.world} gloo processes, L = {args.length}, {args.layout} sharding")
    print(f"ring steps computed per rank (of {args.world}): {steps}")
    print(f"equal to one-pass causal attention (|difference| <= {ATOL:g}): {same}")
    return 0 if same else 1


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over the loopback interface
    sys.exit(main())
