"""What this machine can run: a CUDA device, triton for chapter 13's kernels, and which checks need them;
and how many of its cores the grader's own tensors use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def needs_cuda(check) -> bool:
    return check.requires == "cuda" or any(getattr(c, "device", "cpu") == "cuda" for c in check.calls)


#: Why a kernel exercise's checks are skipped where triton is not installed (one line).
NEEDS_TRITON = "needs triton, not installed here: pip install -r requirements-kernels.txt"


def triton_available() -> bool:
    """Whether triton can be imported here (chapter 13's kernels), without importing it."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread while the checks are built and judged (and, in a grading, while the worker
    runs): the cases' and the judges' tensors are tiny, and OpenMP's spinning threads would take the
    worker's core (judging a whole submission took 3x as long; on 2 busy cores, building
    find_leaking_layer's checks 13x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
