"""Sharded class mode: which students one of N machines grades, and what it ran with.

``python -m grader class DIR --shard i/N`` grades the students whose stable hash
falls in shard i (0 <= i < N). The hash is sha256 of the student's name, never
Python's ``hash()``, which is salted per process: every machine of an array job must
compute the same split without talking to the others. Without ``--shard`` the shard
comes from the engine's environment (:func:`from_env`):

* Slurm job arrays: ``SLURM_ARRAY_TASK_ID`` and ``SLURM_ARRAY_TASK_COUNT`` (the id
  counted from ``SLURM_ARRAY_TASK_MIN``, so ``--array=1-4`` works as well as ``0-3``);
* Kubernetes Indexed Jobs: ``JOB_COMPLETION_INDEX`` with ``GRADER_SHARD_COUNT`` (the
  Job's ``completions``; Kubernetes gives the index but not the count);
* anything else, e.g. a GitHub Actions matrix: ``GRADER_SHARD=i/N``.

Each shard writes ``class-run.json`` next to its grades (:func:`run_record`): the
grader's fingerprint, the exercises, the options, a keyed hash of the seed (never the
seed), the shard, the whole class as this shard saw it and the rows it graded. That
is what :mod:`~grader.runners.classmode.merge` checks before it puts shards together.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_FILE = "class-run.json"
RUN_FORMAT = 1
#: The count of a Kubernetes Indexed Job (its ``completions``), which Kubernetes does not export.
COUNT_ENV = "GRADER_SHARD_COUNT"
#: ``i/N`` from anything else (a GitHub Actions matrix: ``GRADER_SHARD: ${{ matrix.shard }}/4``).
SHARD_ENV = "GRADER_SHARD"


@dataclass(frozen=True)
class Shard:
    index: int  # 0 <= index < count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, name: str) -> bool:
        return shard_of(name, self.count) == self.index


def shard_of(name: str, count: int) -> int:
    """The shard of a student: sha256 of the name, the same on every machine and run."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % count


def parse(text: str, origin: str = "--shard") -> Shard:
    """``"i/N"`` -> Shard, or a SystemExit that says what was expected."""
    index, sep, count = str(text).strip().partition("/")
    try:
        shard = Shard(int(index), int(count)) if sep else None
    except ValueError:
        shard = None
    if shard is None or shard.count < 1 or not 0 <= shard.index < shard.count:
        raise SystemExit(f"{origin} must be i/N with 0 <= i < N (shards are counted from 0), e.g. 0/4 .. "
                         f"3/4; got {text!r}.")
    return shard


def from_env(env: Mapping[str, str] | None = None) -> tuple[Shard, str] | None:
    """The shard the engine running us asks for, and which variables said so; None when none does."""
    env = os.environ if env is None else env
    if env.get(SHARD_ENV):
        return parse(env[SHARD_ENV], f"${SHARD_ENV}"), f"${SHARD_ENV}"
    if env.get("SLURM_ARRAY_TASK_ID") and env.get("SLURM_ARRAY_TASK_COUNT"):
        where = "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"
        try:
            index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0") or 0)
            count = int(env["SLURM_ARRAY_TASK_COUNT"])
        except ValueError:
            raise SystemExit(f"{where} are not integers: {env['SLURM_ARRAY_TASK_ID']!r}, "
                             f"{env['SLURM_ARRAY_TASK_COUNT']!r}.") from None
        if env.get("SLURM_ARRAY_TASK_STEP", "1") not in ("", "1"):
            raise SystemExit(f"a Slurm array with a step ({env['SLURM_ARRAY_TASK_STEP']}) does not number "
                             f"its tasks 0..N-1: use --array=0-{count - 1} or pass --shard i/N yourself.")
        return parse(f"{index}/{count}", where), where
    if env.get("JOB_COMPLETION_INDEX"):
        if not env.get(COUNT_ENV):
            raise SystemExit(f"$JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job) but ${COUNT_ENV} is "
                             f"not: set it to the Job's completions so every pod knows how many shards there "
                             f"are.")
        where = f"$JOB_COMPLETION_INDEX/${COUNT_ENV}"
        return parse(f"{env['JOB_COMPLETION_INDEX']}/{env[COUNT_ENV]}", where), where
    return None


def seed_tag(seed: int) -> str:
    """A keyed hash of the seed: two shards with the same tag used the same seed, and the tag
    does not give the seed away (the seed is the HMAC key; a 128-bit seed cannot be guessed
    from it). It identifies a seed only within this grader's runs."""
    return hmac.new(str(seed).encode(), b"grader class-run seed tag v1", hashlib.sha256).hexdigest()[:32]


def public_options(extra: Sequence[str]) -> list[str]:
    """The grading options that change grades (the engine's arguments but the run's own paths)."""
    out, skip = [], False
    for a in extra:
        if skip:
            skip = False
        elif a == "--hide":
            skip = True
        else:
            out.append(a)
    return out


def run_record(*, fingerprint: str, exercises: Sequence[str], options: Sequence[str], seed: int,
               shard: Shard | None, everyone: Sequence[str], rows: Sequence[dict[str, Any]],
               wall: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What one class run (or shard) graded, with what; written as OUT/class-run.json."""
    return {"format": RUN_FORMAT, "grader": fingerprint, "exercises": list(exercises),
            "options": list(options), "seed_tag": seed_tag(seed),
            "shard": None if shard is None else [shard.index, shard.count],
            "class": list(everyone), "rows": list(rows), "wall_seconds": round(wall, 2), **(extra or {})}


def write_record(out: Path, record: dict[str, Any]) -> Path:
    path = out / RUN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def read_record(out: Path) -> dict[str, Any]:
    """OUT/class-run.json, or a SystemExit that says what is wrong with it."""
    path = out / RUN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"{out} has no {RUN_FILE}: expected the --out folder of a class run "
                         f"(`python -m grader class ... --out {out}`) that finished.") from None
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path} cannot be read ({e}); grade that shard again.") from None
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
        raise SystemExit(f"{path} is not a class-run record this grader reads (format "
                         f"{data.get('format') if isinstance(data, dict) else '?'}, expected {RUN_FORMAT}).")
    return data
