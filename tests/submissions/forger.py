"""Grader fixture: every exercise writes to the grader's own status pipe or records.

Student code runs in the worker, whose status pipe to the parent is an open
descriptor it can find and write to. Each function here sends the parent
something it must read as hostile, and the parent must charge that exercise
("sent data the grader cannot read", or its time limit), never crash, never call
it a usage error, keep its deadlines, and grade the other exercises. Never
import this file: it is only ever run inside the grader's sandboxed worker.
"""

import fcntl
import gc
import os
import signal
import stat
import sys
import time

import torch


def _status_pipes():
    """The worker's write ends of pipes: its status pipe among them (not stdin/stdout/stderr)."""
    out = []
    for fd in range(3, 256):
        try:
            writes = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and writes:
                out.append(fd)
        except OSError:
            pass
    return out


def _say(data: bytes) -> None:
    for fd in _status_pipes():
        try:
            os.write(fd, data)
        except OSError:
            pass


def _exercise_and_check():
    """(exercise index, check index) of the call in progress, from the worker's own frames."""
    frame = sys._getframe()
    while frame is not None:
        if "ei" in frame.f_locals and "check" in frame.f_locals:
            return frame.f_locals["ei"], frame.f_locals["check"].index
        frame = frame.f_back
    return 0, 0


def causal_mask(n, *, device=None):
    # a 5000-digit number: int() of it raises in the parent
    _say(b"start " + b"9" * 5000 + b"\n")
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def padding_mask(lengths, max_len):
    # a line that never ends: a parent that buffers it keeps every byte
    for _ in range(64):
        _say(b"9" * 65536)
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def decoder_mask(lengths, max_len):
    # ignores the worker's own alarm, and says "start" every half second: a deadline that is
    # moved by what the worker says never comes
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    ei, _ = _exercise_and_check()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        _say(f"start {ei}\n".encode())
        time.sleep(0.5)
    return None


def document_mask(doc_ids):
    # a forged record, announced as this check's: a call that took 10**400 seconds
    log = next(o for o in gc.get_objects() if type(o).__name__ == "Log" and hasattr(o, "append"))
    record = {"output": None, "error": None, "devices": None, "args_after": None, "grads": None,
              "seconds": 10**400, "where": None}
    ei, ci = _exercise_and_check()
    _say(f"check {ei} {ci} {log.append([record])}\n".encode())
    time.sleep(5)
    return doc_ids[..., :, None] == doc_ids[..., None, :]


def sliding_window_mask(n, window, *, device=None):
    # a small record whose one long string is referenced 3000 times: 300 MB of copies in the parent
    log = next(o for o in gc.get_objects() if type(o).__name__ == "Log" and hasattr(o, "append"))
    ei, ci = _exercise_and_check()
    big = "x" * 100_001
    record = {"output": None, "error": big, "devices": None, "args_after": [big] * 3000, "grads": None,
              "seconds": 0.0, "where": None}
    _say(f"check {ei} {ci} {log.append([record])}\n".encode())
    time.sleep(5)
    i = torch.arange(n, device=device)
    return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)


def prefix_lm_mask(n, prefix_len, *, device=None):
    # a line in a language the parent does not speak, then bytes that are not ASCII
    _say("what \u00e9\n".encode())
    i = torch.arange(n, device=device)
    return (i[None, :] <= i[:, None]) | (i[None, :] < prefix_len)
