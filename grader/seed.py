"""The hidden-case seed: the one place that resolves, validates and draws it.

Every hidden case is drawn from a stream keyed by the seed and the exercise's
name (:func:`grader.cases.generator`, SHA-256), so one case seen in feedback
says nothing about another, *unless* the seed itself can be found by trying
candidates: with the grader's code public, a candidate costs microseconds, and
every seed below 2**64 is within reach of a determined student. The default is
therefore 128 random bits, and a shorter seed from the instructor draws a warning.

    python -m grader.seed            # print a fresh 128-bit seed
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping

#: The environment variable that carries the seed (never the command line: every
#: process can read every other's /proc/PID/cmdline).
SEED_ENV = "GRADER_SEED"
BITS = 128
#: Seeds below this many values can be searched (see the module docstring).
SEARCHABLE = 2**64


class SeedError(ValueError):
    """A seed that is not an integer."""


def draw() -> int:
    """A fresh seed of :data:`BITS` random bits."""
    return secrets.randbits(BITS)


def parse(text: str, origin: str = f"${SEED_ENV}") -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise SeedError(f"{origin} must be an integer (make one with `python -m grader.seed`); "
                        f"got {text.strip()!r}") from None


def from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The seed in ``$GRADER_SEED``, or None when it is unset or empty."""
    text = (os.environ if environ is None else environ).get(SEED_ENV, "").strip()
    return parse(text) if text else None


def weakness(seed: int) -> str | None:
    """Why ``seed`` is too short to keep hidden cases hidden, or None."""
    if abs(seed) >= SEARCHABLE:
        return None
    bits = max(abs(seed).bit_length(), 1)
    return (f"the seed {seed} has only {bits} bits: a student who sees one hidden case (in an error message, "
            f"say) can try every seed of that size with the public grader and then know every hidden case. "
            f"Use a 128-bit seed: `export {SEED_ENV}=$(python -m grader.seed)`.")


def warn_if_weak(seed: int, origin: str) -> None:
    """Print :func:`weakness` on stderr as a warning (nothing for a strong seed)."""
    why = weakness(seed)
    if why:
        print(f"warning: {why} (seed from {origin})", file=sys.stderr)


def resolve(arg: int | None, *, fallback: tuple[int, str] | None = None) -> tuple[int, str]:
    """The seed to grade with and where it came from: ``--seed`` (``arg``), else
    ``$GRADER_SEED``, else ``fallback`` ((seed, origin), e.g. the last class run's),
    else a fresh draw. Warns on stderr when a seed given by the instructor is short
    enough to search, or sits on the command line. Raises :class:`SeedError` for
    a ``$GRADER_SEED`` that is not an integer."""
    if arg is not None:
        print(f"warning: --seed is on the command line, which every process on this machine can read "
              f"(student code included); pass it as ${SEED_ENV} instead.", file=sys.stderr)
        warn_if_weak(arg, "--seed")
        return arg, "--seed"
    env = from_env()
    if env is not None:
        warn_if_weak(env, f"${SEED_ENV}")
        return env, f"${SEED_ENV}"
    if fallback is not None:
        return fallback
    return draw(), "drawn at random (none given)"


def for_command(arg: int | None, *, fallback: tuple[int, str] | None = None) -> tuple[int, str]:
    """:func:`resolve` for a command's main: a ``$GRADER_SEED`` that is not an integer
    ends the command with the reason, not a traceback."""
    try:
        return resolve(arg, fallback=fallback)
    except SeedError as e:
        raise SystemExit(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m grader.seed``: print a fresh seed (``--help`` says what it is for)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m grader.seed",
        description=f"Print a fresh 128-bit hidden-case seed, drawn with the secrets module. Draw one per "
                    f"term and keep it secret: export {SEED_ENV}=$(python -m grader.seed)")
    parser.parse_args(argv)
    print(draw())
    return 0


if __name__ == "__main__":
    sys.exit(main())
