"""``python -m attnmask.demo`` runs on a fresh interpreter and reports tiny diffs."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_runs_and_prints_the_diffs():
    cmd = [sys.executable, "-m", "attnmask.demo"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for title in ("causal_mask(5)", "sliding_window_mask", "prefix_lm_mask", "document_mask"):
        assert title in out
    assert "■" in out and "·" in out
    diffs = re.findall(r"max \|diff\| = ([0-9.e+-]+)", out)
    assert len(diffs) == 2, out
    assert all(float(d) < 1e-5 for d in diffs), diffs
