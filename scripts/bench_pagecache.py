"""Measure what timing alone carries through the page cache from one student to the next.

Two students graded one after the other (never alive together), each in the sandbox:
student A reads one byte of chosen pages of a large read-only file every worker sees (a
BITS-bit key, one page per bit, STRIDE pages apart so that readahead joins no two); student B,
graded next, maps the file (``MADV_RANDOM``: a fault reads one page), touches each of those
pages once and prints how long each touch took (log2 of its nanoseconds, a letter each).
The script splits B's times in two (Otsu's threshold), reads the key back, and reports
the bits it got right, the error rate p and what a grading carries: BITS x (1 - H(p)) bits.
``mincore``, ``cachestat`` and ``RWF_NOWAIT``, which answered the same question without timing, are refused
(grader.sandbox.syscalls); the fault counters (``getrusage``'s majflt, ``/proc/self/stat``)
answer it too, and carry no more than this.

Usage: python scripts/bench_pagecache.py [--bits 256] [--stride 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CAUSAL = "\ndef causal_mask(L, device=None):\n    import torch\n" \
         "    return torch.ones(L, L, dtype=torch.bool, device=device).tril()\n"
TOUCH = r'''
import os
def touch(path, pages):
    fd = os.open(path, os.O_RDONLY)
    for page in pages:
        os.pread(fd, 1, page * 4096)
    os.close(fd)
    return len(pages)
TOUCHED = touch(%r, %r)
'''
TIME = r'''
import mmap, os, time
def times(path, pages):
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, (max(pages) + 1) * 4096, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)
    out = []
    for page in pages:
        t = time.perf_counter_ns()
        m[page * 4096]
        out.append(time.perf_counter_ns() - t)
    return out
T = "".join(chr(97 + min(25, t.bit_length())) for t in times(%r, %r))
_ = print("\n".join("T " + T[i:i + 64] for i in range(0, len(T), 64)), flush=True)
'''


def large_file(need: int) -> str:
    """A file under /usr, at least ``need`` bytes, that every worker sees."""
    for folder in ("/usr/lib", "/usr/share"):
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    if not os.path.islink(path) and os.path.isfile(path) and os.path.getsize(path) >= need:
                        return path
                except OSError:
                    continue
    raise SystemExit(f"no file under /usr of {need} bytes")


def otsu(values: list[float]) -> float:
    """The threshold that best splits ``values`` in two (between-class variance)."""
    xs = sorted(values)
    best, cut = -1.0, xs[0]
    for i in range(1, len(xs)):
        a, b = xs[:i], xs[i:]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        var = len(a) * len(b) * (ma - mb) ** 2
        if var > best:
            best, cut = var, (xs[i - 1] + xs[i]) / 2
    return cut


def entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def one_round(path: str, bits: int, stride: int, tmp: Path) -> tuple[int, float]:
    """Bits right, and the error rate, of one pair of gradings."""
    from grader import engine

    key = [random.getrandbits(1) for _ in range(bits)]
    pages = [(1 + i) * stride for i in range(bits)]
    with open(path, "rb") as f:  # nothing of the file cached: what B reads comes from A
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    a, b = tmp / "a.py", tmp / "b.py"
    a.write_text(TOUCH % (path, [p for p, k in zip(pages, key) if k]) + CAUSAL)
    b.write_text(TIME % (path, pages) + CAUSAL)
    engine.grade(a, exercises=["causal_mask"])
    out = engine.grade(b, exercises=["causal_mask"]).output
    letters = "".join(re.findall(r"^T ([a-z]+)$", out, re.M))  # 64 a line: the report cuts long ones
    if len(letters) != bits:
        raise SystemExit(f"student B printed {len(letters)} times of {bits}: {out[-500:]}")
    times = [float(ord(c) - 97) for c in letters]  # log2 of each touch's nanoseconds
    cut = otsu(times)
    got = [1 if t < cut else 0 for t in times]  # fast: cached, A read it
    right = sum(g == k for g, k in zip(got, key))
    return right, 1 - right / bits


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", type=int, default=256)
    p.add_argument("--stride", type=int, default=64, help="pages between two bits (default 64)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    path = large_file((args.bits + 2) * args.stride * 4096)
    print(f"file: {path}; {args.bits} bits per grading, {args.stride} pages apart; load average "
          f"{os.getloadavg()[0]:.2f}")
    carried = []
    with tempfile.TemporaryDirectory(prefix="bench-pagecache-") as tmp:
        for r in range(args.rounds):
            right, err = one_round(path, args.bits, args.stride, Path(tmp))
            carried.append(args.bits * (1 - entropy(err)))
            print(f"round {r + 1}: {right}/{args.bits} bits right (error rate {err:.3f}): "
                  f"{carried[-1]:.0f} bits carried")
    print(f"timing alone carries about {min(carried):.0f}-{max(carried):.0f} bits from one grading to the "
          f"next ({args.bits} tried; more pages or files carry more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
