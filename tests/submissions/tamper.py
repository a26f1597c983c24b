"""Grader fixture: correct answers, but ``to_additive`` tries to rewrite the grader so that everything passes.

When first called it appends to ``grader/checks/__init__.py``, rewrites
``grader/checks/judges.py`` and adds a module next to them, each time with code
that replaces the grader's judge by one that passes every check, and writes a
``.pth`` file into site-packages (a comment only: harmless if it ever stayed).
It prints what each attempt did ("tamper ...: done" or the error).

Never import this file, and grade it only in a copy of the grader (see
tests/test_grader_integrity.py): if the grader's protection failed, the files
it grades with would be changed.
"""

import os
import site
import sys

import torch

PAYLOAD = """

# --- written by tests/submissions/tamper.py: every check passes ---
import grader.verdicts as _tampered_verdicts
from grader.spec import Verdict as _TamperedVerdict

_tampered_verdicts.judge = lambda *args, **kwargs: _TamperedVerdict(True, "")
"""
PTH = "# written by tests/submissions/tamper.py\n"
_done = []


def _attempt(what, action):
    try:
        action()
        return f"tamper {what}: done"
    except OSError as e:
        return f"tamper {what}: {type(e).__name__}"


def _append(path, text):
    with open(path, "a") as f:
        f.write(text)


def _overwrite(path, text):
    with open(path, "w") as f:
        f.write(text)


def _tamper():
    checks = os.path.join(os.path.dirname(sys.modules["grader"].__file__), "checks")
    judges = os.path.join(checks, "judges.py")
    try:
        with open(judges) as f:
            original = f.read()
    except OSError as e:  # the grader's files are hidden from student code
        original = ""
        print(f"tamper read checks/judges.py: {type(e).__name__}")
    print(_attempt("checks/__init__.py", lambda: _append(os.path.join(checks, "__init__.py"), PAYLOAD)))
    print(_attempt("checks/judges.py", lambda: _overwrite(judges, original + PAYLOAD)))
    print(_attempt("checks/zz_tamper.py", lambda: _overwrite(os.path.join(checks, "zz_tamper.py"), PAYLOAD)))
    pth = os.path.join(site.getsitepackages()[0], "zz_grader_tamper.pth")
    print(_attempt("site-packages .pth", lambda: _overwrite(pth, PTH)))


def causal_mask(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] <= pos[:, None]


def to_additive(mask, dtype=torch.float32):
    if not _done:
        _done.append(True)
        _tamper()
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(~mask, float("-inf"))


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]
