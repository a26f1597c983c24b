"""The sandboxed worker: runs student code, returns raw outcomes, judges nothing.

Forked from the zygote (:mod:`grader.sandbox.zygote`), which imported torch
inside the sandbox, into namespaces of its own (:mod:`grader.sandbox.namespaces`),
with its own session, a scrubbed environment and limits. It never imports the
reference (``attnmask``) or the checks' judges; it only

1. reads the :class:`Job` (the cells to run, the exercises' names) from stdin, then
   points stdin at /dev/null for the student's code,
2. measures its confinement from inside and says "ready" with what it found;
   if the sandbox does not hold, it stops there, before any student code,
3. runs the submission's cells (:func:`grader.submission.run_cells`),
4. reads the public checks' calls (sent only once it said "loaded"), and for each exercise
   makes them with :func:`grader.sandbox.execute.execute`, appending the outcomes of each check
   to its results file (:mod:`grader.sandbox.channel`); then says "public", reads the hidden
   checks' calls (sent only once the parent has every public outcome) and makes those;
   one line per event on the status pipe.

If it dies or hangs, the parent knows from the last status line where it was,
charges that exercise only, and starts a fresh worker for the rest.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import resource
import signal
import sys
import time
import types
from dataclasses import dataclass, field, replace

import torch

from .. import fnspecs, fused, rules  # noqa: F401 -- fnspecs, fused: imported before the course is hidden
from ..spec import Call, Outcome
from ..submission import Cell, pick, run_cells
from . import channel, deferred, jobwire, namespaces, syscalls
from .execute import execute_limited, reseed
from .limits import CALL_SEED, NOT_RUN, TIME_LIMIT

PRINT_CAP = 2**20  # bytes of print() output kept per stream; the rest is counted and dropped


@dataclass
class CheckJob:
    index: int  # position of the check in its exercise's list
    calls: list[Call]
    want_grads: bool = False


@dataclass
class Job:
    cells: list[Cell]
    exercises: list[tuple[int, str, list[CheckJob]]]  # (index in the grading run, name, []): calls come later
    cell_budget: float
    exercise_budget: float
    memory_bytes: int | None = None
    helpers: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # paths the worker must not see: it counts those it does


class _Status:
    """One line per event on the status pipe; silent if student code closed it."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, line: str) -> None:
        try:
            os.write(self.fd, (line + "\n").encode())
        except OSError:
            pass


class _Capped:
    """A text stream for sys.stdout/sys.stderr that keeps the first PRINT_CAP bytes."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, fd: int):
        self.fd, self.used, self.dropped = fd, 0, 0

    def write(self, s) -> int:
        data = bytes(s) if isinstance(s, bytes | bytearray) else str(s).encode("utf-8", "replace")
        room = PRINT_CAP - self.used
        if room > 0:
            try:
                os.write(self.fd, data[:room])
            except OSError:
                pass
            self.used += min(room, len(data))
        self.dropped += max(0, len(data) - max(room, 0))
        return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    @property
    def buffer(self) -> _Capped:
        return self  # code that writes bytes to sys.stdout.buffer gets the same cap

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _interpret_triton_without_cuda() -> None:
    """Without CUDA, chapter 13's kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 must be
    set before triton is first imported (the zygote did, where it imported triton for its workers;
    else the student's first cell sets it too). The worker's environment does not carry the parent's."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _set_limits(job: Job) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A print loop or a file-writing loop must not fill the disk: writes past this fail (EFBIG).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    cap = channel.MAX_FILE_BYTES + 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
    # Address-space limits break CUDA (it reserves huge ranges): there the parent watches RSS.
    if job.memory_bytes and not torch.cuda.is_available():
        limit = _vm_size() + job.memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:  # die with the parent, whatever happens to it
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _warm_up_meta() -> None:
    """torch's meta kernels import a lot on first use: pay that before any exercise's clock starts."""
    x = torch.arange(2, device="meta")
    _ = (x[None, :] <= x[:, None]) & (x[None, :] < x[:, None])
    _ = torch.zeros(2, 2, device="meta").masked_fill(_, 0.0).softmax(-1)


def _neutralise_notebook_check() -> None:
    """``from grader import check; check(fn)`` in a submission does nothing here."""
    import grader

    def check(*args, **kwargs):
        return None

    stub = types.ModuleType("grader.runners.single.notebook")
    stub.check = stub.check_all = check
    sys.modules["grader.runners.single.notebook"] = stub
    grader.check = grader.check_all = check


def _run_call(fn, call: Call, want_grads: bool, seconds: float) -> Outcome:
    """One call under the exercise's remaining time."""
    reseed(CALL_SEED)
    return execute_limited(fn, call, want_grads=want_grads, seconds=seconds,
                           timed_out=f"{TIME_LIMIT}: stopped after the exercise's time limit")


def _run_exercise(ei: int, fn, checks: list[CheckJob], budget: float, status: _Status, log: channel.Log,
                  words: tuple[str, str]) -> float:
    """Make the calls of ``checks`` within ``budget`` seconds, between the status lines ``words``
    (start/half for the public pass, resume/done for the hidden one); returns the seconds used."""
    status.send(f"{words[0]} {ei}")
    began = time.monotonic()
    deadline = began + budget
    # A call two checks share (the same object in the job: pickle keeps it one) runs once, and both
    # judge its outcome: the ring's two memory checks read one record of the same calls.
    made: dict[tuple[int, bool], Outcome] = {}
    for check in checks:
        outcomes = []
        for call in check.calls:
            left = deadline - time.monotonic()
            if left <= 0:
                outcomes.append(Outcome(error=f"{TIME_LIMIT}: {NOT_RUN}, the exercise's time was used up"))
                continue
            key = (id(call), check.want_grads)
            if key in made:  # its time was counted once (grader.timing)
                outcomes.append(replace(made[key], seconds=0.0, cpu=0.0))
                continue
            made[key] = _run_call(fn, call, check.want_grads, left)
            outcomes.append(made[key])
        try:
            where = log.append([channel.outcome_to_data(o) for o in outcomes])
        except BaseException as e:  # noqa: BLE001 -- e.g. an enormous output
            why = f"{type(e).__name__}: {e}"[:200]
            err = Outcome(error=f"GraderError: what came back could not be saved ({why})")
            where = log.append([channel.outcome_to_data(err)] * len(outcomes))
        status.send(f"check {ei} {check.index} {where}")
    status.send(f"{words[1]} {ei}")
    return time.monotonic() - began


def prepare() -> None:
    """What every worker does before its job arrives (the zygote does it once for all)."""
    deferred.install()
    syscalls.prepare()  # the seccomp filter, built once here, loaded by every worker
    # The parent is still building the checks: use the time (and keep it off the exercises' clocks).
    _warm_up_meta()
    # The forbidden torch APIs and fused kernels, blocked for the life of every worker forked
    # from here (finding and blocking them takes 20 ms; nothing of the grader's uses them), and
    # the originals dropped, not kept to restore: no path from student code leads back to them.
    rules.forbid_torch_apis_for_good()


def main() -> None:
    """``python -m grader.sandbox.worker STATUS_FD RESULTS_FD``: a worker without the sandbox (for tests)."""
    prepare()
    serve(int(sys.argv[1]), int(sys.argv[2]), confined=False)


def serve(status_fd: int, results_fd: int, confined: bool) -> None:
    """Read the job from stdin, measure the sandbox (when ``confined``), run the job, its records
    appended to ``results_fd``; never returns."""
    status = _Status(status_fd)
    pipe = os.dup(0)  # the job's pipe: what to call arrives on it only after the submission loaded
    job: Job = jobwire.read_frame(pipe)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if devnull != 0:
        os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- the student's stdin is empty
    if confined:
        measured = namespaces.measure(job.secrets)
        status.send("ready " + " ".join(f"{k}={v}" for k, v in measured.items()))
        if namespaces.holds(measured) is not None:
            os._exit(3)  # the parent says why; no student code runs outside the sandbox
    else:
        status.send("ready unconfined")

    _set_limits(job)
    _interpret_triton_without_cuda()
    # A crash in C (a segfault) prints the Python stack to stderr: the parent reads the student's line there.
    faulthandler.enable(file=sys.__stderr__, all_threads=False)
    rules.block_imports()
    rules.block_reference_files(rules.reference_folders(job.secrets))
    _neutralise_notebook_check()
    for name, text in job.helpers.items():
        with open(name, "w") as f:
            f.write(text)
    sys.path.insert(0, os.getcwd())  # the student's own helper modules, as in Jupyter
    out, err = _Capped(1), _Capped(2)
    sys.stdout, sys.stderr = out, err

    loaded = run_cells(job.cells, budget=job.cell_budget, on_cell=lambda i: status.send(f"cell {i}"))
    names = [name for _, name, _ in job.exercises]
    found = pick(loaded, names)
    log = channel.Log(results_fd)
    where = log.append({"found": {n: where for n, (_, where) in found.items()}, "errors": loaded.errors})
    status.send(f"loaded {where}")
    graded = [(ei, found[name][0]) for ei, name, _ in job.exercises if name in found]
    if graded:
        # The calls come now, in two parts: every exercise's public checks, and once they have all
        # run, the hidden ones. Nothing that ran while loading, nor any public check, had a hidden case
        # in reach: the parent sends them after it has judged every public check (grader.hidden).
        public = jobwire.read_frame(pipe)
        used = {ei: _run_exercise(ei, fn, public.get(ei, []), job.exercise_budget, status, log,
                                  ("start", "half")) for ei, fn in graded}
        status.send("public")
        hidden = jobwire.read_frame(pipe)
        for ei, fn in graded:
            _run_exercise(ei, fn, hidden.get(ei, []), job.exercise_budget - used[ei], status, log,
                          ("resume", "done"))
    status.send(f"bye {out.dropped + err.dropped}")
    # Skip interpreter shutdown: student threads or atexit hooks must not keep us alive.
    os._exit(0)


if __name__ == "__main__":
    main()
