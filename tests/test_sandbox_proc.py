"""Two students of one class alive together: nothing of one worker's /proc entry reaches the other.

Every worker is forked from the class's one zygote into pid namespaces of its own, but the
``/proc`` it inherited was the sandbox's: it listed every worker alive, and anyone may read
another process's ``cmdline``, ``comm`` and ``status`` (its signal mask, ``SigBlk``). Student A
writes a key into all three and waits; student B, graded while A waits, scores only if it finds
the key anywhere under ``/proc``.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from grader import engine
from grader.sandbox import bubblewrap, zygote

pytestmark = pytest.mark.skipif(not bubblewrap.available(), reason="needs bubblewrap")

KEY = "k46x"  # short: comm holds 15 bytes
CAUSAL = "\ndef causal_mask(L, device=None):\n    import torch\n" \
         "    return torch.ones(L, L, dtype=torch.bool, device=device).tril()\n"
# A: the key in its name, over its argv and in its signal mask (signals 10 and 12 blocked), then waits.
WRITE = r'''
import ctypes, signal, time
def write(key):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, key.encode(), 0, 0, 0)  # PR_SET_NAME
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
    text = (key * ((end - start) // len(key) + 1)).encode()[: end - start - 1]
    ctypes.memmove(start, text, len(text))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
    print("A wrote", flush=True)
    for _ in range(300):  # until the test ends it
        time.sleep(0.1)
WROTE = write(%r)
'''
# B: every process it can see under /proc, and where the key shows.
READ = r'''
import os
def read(key):
    pids = sorted(n for n in os.listdir("/proc") if n.isdigit())
    found = []
    for pid in pids + ["self"]:
        for name in ("cmdline", "comm", "status", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if key.encode() in data or (name == "status" and b"SigBlk:\t0000000000000a00" in data):
                found.append(f"{pid}/{name}")
    return pids, found
PIDS, FOUND = read(%r)
_ = print("B sees", PIDS, "found", FOUND, flush=True)
def causal_mask(L, device=None):
    import torch
    if not FOUND:
        return torch.zeros(L, L, dtype=torch.bool, device=device)
    return torch.ones(L, L, dtype=torch.bool, device=device).tril()
'''


def _writer_pid() -> int | None:
    """The host's view: the process whose name is the key (A's worker, once it wrote)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/comm") as f:
                    if f.read().strip() == KEY:
                        return int(name)
            except OSError:
                continue
    return None


@pytest.mark.slow
def test_a_worker_sees_no_other_workers_proc_entry(tmp_path, monkeypatch):
    zyg = zygote.Zygote()
    try:
        assert zyg.wait_ready(), zyg.failure()
        monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
        a_path, b_path = tmp_path / "a.py", tmp_path / "b.py"
        a_path.write_text(WRITE % KEY + CAUSAL)
        b_path.write_text(READ % KEY)
        a: dict = {}
        thread = threading.Thread(target=lambda: a.update(r=engine.grade(a_path, exercises=["causal_mask"])))
        thread.start()
        writer = None
        for _ in range(1200):  # until A's worker carries the key (the host sees every process)
            writer = _writer_pid()
            if writer is not None or not thread.is_alive():
                break
            threading.Event().wait(0.1)
        assert writer is not None, f"A never wrote its key: {a.get('r') and a['r'].output}"
        b = engine.grade(b_path, exercises=["causal_mask"])
        assert _writer_pid() == writer, "A ended before B read: the test proves nothing"
        os.kill(writer, signal.SIGKILL)
        thread.join()
        assert "found []" in b.output, b.output
        assert "B sees []" in b.output, b.output  # not even a number: no other process is in view
        assert b.exercise("causal_mask").score == 0, b.output
    finally:
        zyg.close()


def test_a_worker_cannot_write_the_kernels_settings(tmp_path):
    """A worker of root is uid 0 to the kernel's file checks: /proc/sys (``core_pattern``: a program
    the kernel runs as root) must be read-only to it, and the page-frame files out of view."""
    path = tmp_path / "s.py"
    path.write_text(r'''
import os
def probe():
    out = []
    for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"):
        try:
            os.close(os.open(p, os.O_WRONLY))
            out.append(p)
        except OSError:
            pass
    hidden = ("/proc/kpageflags", "/proc/kpagecount", "/proc/kcore", "/proc/keys")
    out += [p for p in hidden if os.path.exists(p)]
    return out
OPEN = probe()
_ = print("open", OPEN, flush=True)
def causal_mask(L, device=None):
    import torch
    return torch.ones(L, L, dtype=torch.bool, device=device).tril(int(bool(OPEN)))
''')
    r = engine.grade(Path(path), exercises=["causal_mask"])
    assert "open []" in r.output, r.output
    assert r.exercise("causal_mask").status == "passed", r.output
