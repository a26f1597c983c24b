"""Fixtures shared by the attnmask tests: the devices to run on, and the oracle
they are compared against (PyTorch's own attention in float64)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, _CUDA])])
def device(request) -> str:
    """Every test that takes ``device`` runs on the CPU and (skipped here) on CUDA."""
    return request.param


@pytest.fixture(scope="session")
def sdpa64():
    """``sdpa64(q, k, v, attn_mask=None, **kw) -> out`` in float64: PyTorch's
    math-backend scaled_dot_product_attention on the (already rounded) inputs
    converted to float64, the oracle for every dtype. Its boolean
    mask uses our convention (True = may attend) and gives zeros for a fully
    masked row."""

    def run(q, k, v, attn_mask=None, **kw):
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(
                q.detach().double(), k.detach().double(), v.detach().double(), attn_mask=attn_mask, **kw
            )
        return out

    return run


# Low-precision results are compared with a float64 oracle run on the same rounded
# inputs, so the tolerance only has to cover rounding inside the computation.
_TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@pytest.fixture(scope="session")
def tol():
    """``tol(dtype) -> dict(atol=, rtol=)`` for torch.testing.assert_close."""
    return _TOLERANCES.__getitem__



def _borrowing_venv(dest, *, system_site_packages: bool = False, pth: bool = True):
    """A new venv at ``dest`` (no pip) that imports what the running environment has installed,
    wherever that is: a ``.pth`` file in its site-packages names the running interpreter's own
    (``pth=False``: none; put :func:`_running_site_packages` on ``PYTHONPATH`` instead). Not
    ``--system-site-packages`` alone, which reaches the base interpreter's site-packages, not a
    running venv's. Returns the venv's python."""
    import subprocess
    import sys
    from pathlib import Path

    dest = Path(dest)
    args = [sys.executable, "-m", "venv", "--without-pip", str(dest)]
    if system_site_packages:
        args.append("--system-site-packages")
    subprocess.run(args, check=True, timeout=120)
    python = dest / "bin" / "python"
    if pth:
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        purelib = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                                 timeout=60).stdout.strip()
        (Path(purelib) / "_running_env.pth").write_text("\n".join(_running_site_packages()) + "\n")
    return python


def _running_site_packages() -> list[str]:
    """The running interpreter's site-packages folders (where torch and the rest are installed)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


@pytest.fixture(scope="session")
def borrowing_venv():
    """``borrowing_venv(dest, system_site_packages=False, pth=True) -> python`` (:func:`_borrowing_venv`)."""
    return _borrowing_venv


@pytest.fixture(scope="session")
def running_site_packages() -> list[str]:
    return _running_site_packages()
