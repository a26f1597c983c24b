"""The seed: 128 random bits by default, a warning for one short enough to search."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grader import seed as seeds
from grader.runners.platforms.gradescope import SEED_FILE, build


def test_drawn_seeds_have_128_bits():
    drawn = [seeds.draw() for _ in range(32)]
    assert all(0 <= s < 2**128 for s in drawn)
    assert max(drawn) >= 2**120 and len(set(drawn)) == 32
    out = subprocess.run([sys.executable, "-m", "grader.seed"], capture_output=True, text=True, check=True)
    assert 0 <= int(out.stdout) < 2**128  # an integer, printed alone


@pytest.mark.parametrize("value", [0, 7, 20250901, 2**63, -(2**40)])
def test_a_searchable_seed_warns(value, capsys):
    assert seeds.weakness(value)
    seeds.warn_if_weak(value, "$GRADER_SEED")
    assert "128-bit" in capsys.readouterr().err


def test_a_128_bit_seed_does_not_warn(monkeypatch, capsys):
    strong = seeds.draw() | 2**100
    monkeypatch.setenv(seeds.SEED_ENV, str(strong))
    assert seeds.resolve(None) == (strong, "$GRADER_SEED")
    assert capsys.readouterr().err == ""


def test_resolution_order_and_errors(monkeypatch, capsys):
    monkeypatch.delenv(seeds.SEED_ENV, raising=False)
    assert seeds.resolve(None, fallback=(5, "the last run")) == (5, "the last run")
    value, origin = seeds.resolve(None)
    assert value >= 0 and origin.startswith("drawn")
    monkeypatch.setenv(seeds.SEED_ENV, "12")
    assert seeds.resolve(None, fallback=(5, "x"))[0] == 12
    assert seeds.resolve(99)[0] == 99
    assert "command line" in capsys.readouterr().err  # --seed can be read by any process
    monkeypatch.setenv(seeds.SEED_ENV, "not a number")
    with pytest.raises(seeds.SeedError, match="integer"):
        seeds.resolve(None)


def test_gradescope_and_class_mode_draw_128_bit_seeds(tmp_path, monkeypatch):
    monkeypatch.delenv(seeds.SEED_ENV, raising=False)
    from grader.runners.classmode import classroom

    drawn, origin = seeds.for_command(None)  # what `python -m grader gradescope build` does
    assert drawn >= 2**64 and "random" in origin
    drawn, origin = seeds.for_command(None, fallback=classroom.last_run_seed(tmp_path))  # class mode
    assert drawn >= 2**64 and "random" in origin
    (tmp_path / "manifest.json").write_text('{"seed": 12345}')
    assert seeds.for_command(None, fallback=classroom.last_run_seed(tmp_path))[0] == 12345
    zip_path = build(tmp_path / "gs", seed=seeds.for_command(None)[0])
    assert int((zip_path.parent / "autograder" / SEED_FILE).read_text()) >= 2**64


def test_seed_help_helps_and_draws_nothing():
    p = subprocess.run([sys.executable, "-m", "grader.seed", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "usage: python -m grader.seed" in p.stdout and "GRADER_SEED" in p.stdout
    assert not any(line.strip().isdigit() for line in p.stdout.splitlines())
