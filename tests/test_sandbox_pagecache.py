"""Two students graded one after the other, never alive together: the page cache between them.

Student A reads chosen pages of a large read-only file every worker sees (under ``/usr``): a
12-bit key, one page per bit. Student B, graded later, asks which of those pages are cached,
without timing: ``preadv2(..., RWF_NOWAIT)`` (EAGAIN where a page is not cached) and ``mincore``
on a mapping of the file. Both worked in the worker, and the key crossed; the allowlist
(grader.sandbox.syscalls) now refuses them. What timing alone still carries is measured by
``scripts/bench_pagecache.py`` and written in the grader guide.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader import engine
from grader.sandbox import bubblewrap

pytestmark = pytest.mark.skipif(not bubblewrap.available(), reason="needs bubblewrap")

KEY, BITS, STRIDE = 0xA5C, 12, 64  # one page in 64 per bit: far from each other's readahead
CAUSAL = "\ndef causal_mask(L, device=None):\n    import torch\n" \
         "    return torch.ones(L, L, dtype=torch.bool, device=device).tril()\n"
TOUCH = r'''
import os
def touch(path, key, bits, stride):
    fd = os.open(path, os.O_RDONLY)
    for i in range(bits):
        if key >> i & 1:
            os.pread(fd, 1, (1 + i) * stride * 4096)
    os.close(fd)
    return key
TOUCHED = touch(%r, %d, %d, %d)
'''
PROBE = r'''
import ctypes, mmap, os
def probe(path, bits, stride):
    said = {}
    fd = os.open(path, os.O_RDONLY)
    key = 0
    try:
        for i in range(bits):
            try:
                os.preadv(fd, [bytearray(1)], (1 + i) * stride * 4096, os.RWF_NOWAIT)
                key |= 1 << i  # cached: A read it
            except BlockingIOError:
                pass  # EAGAIN: not cached, told without timing
        said["preadv2"] = key
    except OSError as e:
        said["preadv2"] = "refused " + type(e).__name__
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    size = (bits + 2) * stride * 4096
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    vec = (ctypes.c_ubyte * (size // 4096))()
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0:
        said["mincore"] = sum((vec[(1 + i) * stride] & 1) << i for i in range(bits))
    else:
        said["mincore"] = "refused " + os.strerror(ctypes.get_errno())
    os.close(fd)
    return said
SAID = probe(%r, %d, %d)
_ = print("B", SAID, flush=True)
def causal_mask(L, device=None):
    import torch
    learned = [v for v in SAID.values() if isinstance(v, int)]
    return torch.ones(L, L, dtype=torch.bool, device=device).tril(0 if learned else 1)
'''


def _large_file() -> str:
    """A file under /usr that every worker sees, large enough for the key's pages."""
    need = (BITS + 2) * STRIDE * 4096
    for folder in ("/usr/lib", "/usr/share", "/usr/bin"):
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) >= need:
                        with open(path, "rb"):
                            return path
                except OSError:
                    continue
    pytest.skip("no file under /usr large enough")


def test_the_next_student_cannot_ask_the_page_cache_what_the_last_one_read(tmp_path):
    path = _large_file()
    with open(path, "rb") as f:  # start from nothing cached: what B would learn comes from A
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(TOUCH % (path, KEY, BITS, STRIDE) + CAUSAL)
    b.write_text(PROBE % (path, BITS, STRIDE))
    first = engine.grade(Path(a), exercises=["causal_mask"])
    assert first.exercise("causal_mask").status == "passed", first.output
    second = engine.grade(Path(b), exercises=["causal_mask"])
    said = second.output.split("B ", 1)[-1]
    assert "'preadv2': 'refused" in said and "'mincore': 'refused" in said, second.output
    assert second.exercise("causal_mask").score == 0, second.output
