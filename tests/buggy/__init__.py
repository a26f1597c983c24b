"""Student-like implementations of the exercises, for testing the checks:
``correct`` and ``native`` (two correct styles), and one module per exercise
family holding classic mistakes. Plus :func:`grade`, the in-process stand-in
for the grading engine."""

from __future__ import annotations

import torch

from grader.devices import triton_available
from grader.sandbox.execute import execute
from grader.spec import Check, Verdict


def grade(fn, checks: list[Check]) -> dict[str, Verdict]:
    """Run every check on ``fn`` in-process (CUDA checks only where CUDA exists)."""
    out = {}
    for check in checks:
        if check.requires == "cuda" and not torch.cuda.is_available():
            continue
        if check.requires == "triton" and not triton_available():
            continue
        outcomes = [execute(fn, call, want_grads=check.want_grads) for call in check.calls]
        out[check.name] = check.judge(check.calls, outcomes)
    return out


def failures(verdicts: dict[str, Verdict]) -> dict[str, str]:
    return {name: f"{v.message}\n{v.detail}" for name, v in verdicts.items() if not v.passed}
