"""What a worker is given: its limits, its environment, and the names of what it reports.

Both sides read these: the parent (:mod:`grader.sandbox.popen`, the supervisor, the engine,
the notebook's ``check``) and the worker itself (:mod:`grader.sandbox.worker`).
Only the standard library is imported here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: Environment variables a worker may see: nothing secret (no GRADER_SEED, no tokens).
ENV_ALLOWED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH",
               "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES")
#: Prefix of the error of a call the worker stopped at the exercise's time limit.
TIME_LIMIT = "TimeLimit"
NOT_RUN = "not run"
#: torch's seed before every call, in the worker and the notebook: randomness in student code repeats.
CALL_SEED = 0


class ChannelError(Exception):
    """What came back from the worker is not plain data (see :mod:`grader.sandbox.channel`)."""
@dataclass
class Limits:
    timeout: float = 10.0  # per exercise, seconds
    load_timeout: float = 40.0  # running the submission's cells, seconds
    memory_mb: int | None = 2048  # beyond what torch itself needs
    cell_timeout: float | None = None  # per cell; default min(timeout, load_timeout / 2)

    @property
    def grace(self) -> float:
        return max(1.0, 0.25 * self.timeout)

    @property
    def cell_budget(self) -> float:
        return self.cell_timeout or min(self.timeout, self.load_timeout / 2)


def worker_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED}
    env.update(
        HOME=str(tmp),  # a student's ~/.config, ~/.local, ~/.cache stay in the sandbox
        PYTHONHASHSEED="0",  # sets iterate the same way on every run: same results file
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",  # tiny tensors; leave the other core to the parent's judges
        MKL_NUM_THREADS="1",
        TMPDIR=str(tmp),
    )
    return env




_notes: set[str] = set()


def note(text: str) -> None:
    """Tell whoever runs the grader (stderr, once per process), not the student."""
    if text not in _notes:
        _notes.add(text)
        print(f"grader: note: {text}", file=sys.stderr)
