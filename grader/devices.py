"""What this machine can run: a CUDA device, triton for chapter 13's kernels, and which checks need them."""

from __future__ import annotations


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
