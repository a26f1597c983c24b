"""Time and peak memory of masked attention: explicit path, fused path, mask functions, PyTorch SDPA.

    python scripts/bench_attention.py                      # L = 256 .. 2048 on the CPU
    python scripts/bench_attention.py --lengths 512 4096 --device cuda
    python scripts/bench_attention.py --tables masks       # only the second table
    python scripts/bench_attention.py --tables blockmask --lengths 1024 4096   # the BlockMask build

Table ``causal``: four ways to compute causal self-attention of ``q, k, v (B, H, L, d)``:

* ``explicit``: ``attnmask.attention(q, k, v, causal_mask(L))`` -- builds the
  ``(B, H, L, L)`` scores and weights, so it can return the weights;
* ``fused``: the same call with ``need_weights=False``, which hands the boolean
  mask to ``F.scaled_dot_product_attention``;
* ``predicate``: ``attnmask.attention(q, k, v, causal(), need_weights=False)``,
  the mask *function*, which ``attnmask.dispatch`` turns into ``is_causal``;
* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, no mask
  tensor at all. Ratios in the table are relative to this one.

The mask is built before the measurement, like q, k and v: its cost (L * L bytes,
4 MiB at L = 2048) is an input to the first two methods, not part of the call.

Table ``masks``: masks SDPA has no flag for, a causal sliding window
(``--window`` keys) and packed documents (``--documents`` equal documents):

* ``window_predicate``, ``document_predicate``: ``attnmask.attention(q, k, v,
  sliding_window(w) or document(doc_ids), need_weights=False)``; whatever the
  dispatch chooses (on the CPU: materialise the mask, then SDPA) is part of the
  call, the materialisation included;
* ``window_dense``, ``document_dense``: the best alternative, SDPA with the dense
  boolean mask, built before the measurement as an input. Each predicate row's
  ratios are relative to its ``_dense`` row.

Table ``blockmask``: building FlexAttention's ``BlockMask`` of ``--documents`` packed
documents (``document(doc_ids)``, which reads the batch but not the head), the block
mask of the CUDA path of ``attnmask.attention`` (issue 40):

* ``blockmask_per_call``: before, ``create_block_mask(fn, B, H, L, L)`` on every call, so
  ``create_mask`` evaluated the predicate over the whole ``(B, H, L, L)`` grid each time;
* ``blockmask_once``: now, ``attnmask.dispatch.flex_block_mask(fn, B, H, L, L)``: ``H=None``
  (the predicate ignores the head), built on the first call and returned from a cache on
  the next ones (every layer of a model reuses it). Its peak memory is that of the one
  build, over ``(B, 1, L, L)``; its time is a call after the first, a cache lookup.

How the figures are taken, all in one run of this script:

* Time: the methods of one table and one L are timed in one process, *interleaved*:
  ``--rounds`` rounds, each timing every method once (in an order that turns
  round by round), so that a burst of load on a shared machine hits every method
  alike. One sample is the mean of enough back-to-back calls to last about 20 ms,
  after ``--warmup`` calls, with ``time.perf_counter`` (and
  ``torch.cuda.synchronize`` on CUDA). The table gives each method's median sample
  with its spread (lowest-highest), and its ratio to the baseline as the median of
  the rounds' paired ratios (each round's method over that round's baseline) with
  their range.
* Peak extra memory on the CPU: each (method, L) runs in a *fresh* Python
  process, because the process's RSS high-water mark (``VmHWM`` in
  ``/proc/self/status``) can only go up. The process creates its inputs, warms the
  library up on a tiny problem (L = 32, so one-time initialisation is not charged to
  the call), resets the high-water mark to the current RSS (``/proc/self/clear_refs``),
  reads that RSS, makes *one* call, and reports ``VmHWM - RSS before``: every page the
  call touched at its peak, including temporaries that were freed before it returned
  and the output it returns. (``ru_maxrss`` is not used: on Linux it starts from the
  parent's peak.) Where the reset is not allowed and the high-water mark was already
  above the RSS, a smaller peak would be hidden; the script then marks the figure with
  ``*`` (a lower bound). Resolution is a page (KiB); a few hundred KiB is noise.
* Peak extra memory on CUDA: ``torch.cuda.max_memory_allocated()`` minus
  ``torch.cuda.memory_allocated()`` before the call, after
  ``reset_peak_memory_stats`` (caching-allocator bytes, exact).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TABLES = {
    "causal": ("explicit", "fused", "predicate", "sdpa"),
    "masks": ("window_predicate", "window_dense", "document_predicate", "document_dense"),
    "blockmask": ("blockmask_per_call", "blockmask_once"),
}
BASELINE = {"explicit": "sdpa", "fused": "sdpa", "predicate": "sdpa", "sdpa": "sdpa",
            "window_predicate": "window_dense", "window_dense": "window_dense",
            "document_predicate": "document_dense", "document_dense": "document_dense",
            "blockmask_per_call": "blockmask_per_call", "blockmask_once": "blockmask_per_call"}
SAMPLE_S = 0.02  # one timing sample: enough back-to-back calls to last about this long


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    """This process's own RSS high-water mark (VmHWM; ru_maxrss would start from the parent's)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _reset_peak() -> None:
    """Start the high-water mark again from the current RSS, where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _make_call(method: str, L: int, args):
    import torch
    import torch.nn.functional as F

    import attnmask as am

    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (args.batch, args.heads, L, args.head_dim)
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(shape, generator=g, dtype=dtype).to(args.device) for _ in range(3))
    if method.startswith("blockmask_"):
        from attnmask import dispatch

        doc_ids = (torch.arange(L, device=args.device) * args.documents // L).expand(args.batch, L)  # (B, L)
        fn = am.document(doc_ids)
        if method == "blockmask_per_call":  # what dispatch._flex did before: B and H, on every call
            return lambda: am.block_mask(fn, L, L, B=args.batch, H=args.heads, device=args.device)
        return lambda: dispatch.flex_block_mask(fn, args.batch, args.heads, L, L, args.device)
    if method.startswith(("window_", "document_")):
        doc_ids = (torch.arange(L, device=args.device) * args.documents // L).expand(args.batch, L)  # (B, L)
        fn = am.sliding_window(args.window) if method.startswith("window_") else am.document(doc_ids)
        if method.endswith("_predicate"):
            return lambda: am.attention(q, k, v, fn, need_weights=False)[0]
        dense = am.materialize(fn, L, L, B=args.batch, device=args.device)  # an input like q, k, v
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    mask = am.causal_mask(L, device=args.device)  # (L, L), an input like q, k, v
    if method == "explicit":
        return lambda: am.attention(q, k, v, mask)[0]
    if method == "fused":
        return lambda: am.attention(q, k, v, mask, need_weights=False)[0]
    if method == "predicate":
        causal = am.causal()
        return lambda: am.attention(q, k, v, causal, need_weights=False)[0]
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def worker(method: str, L: int, args) -> dict:
    """Measure the peak extra memory of one call of (method, L) in this process."""
    import torch

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        _make_call(method, 32, args)()  # one-time initialisation, on a tiny problem
        call = _make_call(method, L, args)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = call()
            sync()
            peak, hidden = torch.cuda.max_memory_allocated() - before, False
        else:
            _reset_peak()
            before, high_before = _rss_bytes(), _maxrss_bytes()
            out = call()
            peak = _maxrss_bytes() - before
            hidden = high_before > before + 1024 * 1024 and _maxrss_bytes() == high_before
        del out
    return {"method": method, "L": L, "peak_bytes": peak, "lower_bound": hidden,
            "threads": torch.get_num_threads()}


def timings(methods: tuple[str, ...], L: int, args) -> dict[str, list[float]]:
    """Seconds per call of each method, one sample per round, the methods interleaved."""
    import torch

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    samples: dict[str, list[float]] = {m: [] for m in methods}
    with torch.inference_mode():
        calls = {m: _make_call(m, L, args) for m in methods}
        inner = {}
        for m, call in calls.items():
            for _ in range(args.warmup):
                call()
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            inner[m] = max(1, min(200, int(SAMPLE_S / max(time.perf_counter() - t0, 1e-6))))
        for r in range(args.rounds):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for m in order:
                t0 = time.perf_counter()
                for _ in range(inner[m]):
                    calls[m]()
                sync()
                samples[m].append((time.perf_counter() - t0) / inner[m])
    return samples


def run_fresh(method: str, L: int, args) -> dict:
    """Run :func:`worker` in a new interpreter, so the RSS high-water mark starts low."""
    cmd = [sys.executable, __file__, "--worker", method, str(L), *_shared_flags(args)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker {method} L={L} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shared_flags(args) -> list[str]:
    return ["--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
            "--dtype", args.dtype, "--device", args.device, "--warmup", str(args.warmup),
            "--rounds", str(args.rounds), "--window", str(args.window), "--documents", str(args.documents)]


def _mib(n: int) -> str:
    return f"{n / 2**20:8.1f}"


def _row(L: int, method: str, r: dict, base: dict, times: list[float], base_times: list[float]) -> str:
    ratios = [t / b for t, b in zip(times, base_times)]
    t_med = statistics.median(times)
    spread = f"{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f}"
    t_ratio = f"{statistics.median(ratios):6.2f} {min(ratios):5.2f}-{max(ratios):<5.2f}"
    m_ratio = f"{r['peak_bytes'] / base['peak_bytes']:7.1f}" if base["peak_bytes"] > 0 else "    n/a"
    star = "*" if r["lower_bound"] else " "
    memory = f"{_mib(r['peak_bytes'])}{star}{m_ratio}"
    return f"{L:>6} {method:>18} {t_med * 1e3:9.2f} {spread:>15} {t_ratio} {memory}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9, help="timing rounds, every method once per round")
    p.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    p.add_argument("--window", type=int, default=256, help="sliding window, in keys (table masks)")
    p.add_argument("--documents", type=int, default=4, help="packed documents per sequence (table masks)")
    p.add_argument("--worker", nargs=2, metavar=("METHOD", "L"), help=argparse.SUPPRESS)
    args = p.parse_args()

    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return

    cuda = args.device.startswith("cuda")
    started = time.perf_counter()
    rows, times = {}, {}
    for table in args.tables:
        for L in args.lengths:
            for method in TABLES[table]:
                rows[L, method] = worker(method, L, args) if cuda else run_fresh(method, L, args)
            for method, samples in timings(TABLES[table], L, args).items():
                times[L, method] = samples
    threads = next(iter(rows.values()))["threads"]
    where = torch.cuda.get_device_name() if cuda else f"CPU, {threads} threads"
    memory = "torch.cuda.max_memory_allocated" if cuda else "VmHWM - RSS before, fresh process each"
    print(f"self-attention, B={args.batch} H={args.heads} d={args.head_dim} {args.dtype}, "
          f"{where}, torch {torch.__version__}")
    print(f"time: median of {args.rounds} interleaved rounds (spread: lowest-highest); x base: median of "
          f"the rounds' paired ratios (range); peak extra memory: {memory}")
    print(f"the (B, H, L, L) scores alone take B*H*L*L*{torch.finfo(getattr(torch, args.dtype)).bits // 8} "
          "bytes")
    titles = {"causal": "causal; ratios to sdpa (is_causal=True)",
              "masks": f"sliding window of {args.window} and {args.documents} packed documents; "
                       "ratios to the same mask, dense, in SDPA",
              "blockmask": f"the BlockMask of {args.documents} packed documents, before (B and H, built on "
                           "every call) and after (H=None, built once); ratios to before"}
    for table in args.tables:
        print(f"\n{titles[table]}")
        print(f"{'L':>6} {'method':>18} {'time ms':>9} {'spread ms':>15} {'x base':>6} {'range':<11} "
              f"{'peak MiB':>9} {'x base':>7}")
        for L in args.lengths:
            for method in TABLES[table]:
                base = BASELINE[method]
                print(_row(L, method, rows[L, method], rows[L, base], times[L, method], times[L, base]))
    print(f"\ntotal benchmark time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
