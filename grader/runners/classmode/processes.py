"""Running one grading: a subprocess or a fork-server child with a wall-time limit.

:func:`run_limited` runs a command in a session of its own; :class:`Preloaded` forks
the engine's CLI from a server that has imported torch and the grader once. Either
way a grading that runs past its limit is stopped by killing its whole process tree
(:func:`~grader.sandbox.procs.kill_tree`), including processes that moved to sessions of
their own, and
:func:`kill_running` stops every grading still running when the class run is
interrupted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...sandbox import forkserver
from ...sandbox.procs import kill_tree

_PACKAGE_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class RunResult:
    returncode: int | None  # None when killed for time
    timed_out: bool
    seconds: float


def run_limited(argv: Sequence[str], *, timeout: float, log: Path, env: dict[str, str] | None = None,
                cwd: Path | None = None, cpus: set[int] | None = None) -> RunResult:
    """Run ``argv`` in its own process group with stdout+stderr to ``log``; kill the whole
    group when it runs past ``timeout`` seconds, and after it exits (stray children).
    ``cpus``: the cores it (and every process it starts) may run on (Linux)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(proc.pid)
        if cpus and hasattr(os, "sched_setaffinity"):
            # Set before the grader starts its own worker (it is still importing Python by
            # then), so the worker inherits it: the whole grading stays on these cores.
            try:
                os.sched_setaffinity(proc.pid, cpus)
            except OSError:
                pass
        try:
            timed_out = not _wait_unreaped(proc, timeout)
        finally:
            # The pid is not reaped yet (alive or a zombie), so it cannot have been reused:
            # killing its group and its descendants cannot hit an unrelated process.
            kill_tree(proc.pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc.pid)
        rc = proc.wait()
    return RunResult(returncode=None if timed_out else rc, timed_out=timed_out,
                     seconds=time.perf_counter() - t0)


def _wait_unreaped(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``proc`` to exit without reaping it; True if it exited."""
    if not hasattr(os, "waitid"):  # no WNOWAIT here: fall back to reaping (macOS)
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    pause = 0.005
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


# Process groups being graded: their own sessions do not receive the terminal's Ctrl-C,
# so an interrupted class run kills them itself.
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()


def kill_running() -> None:
    with _RUNNING_LOCK:
        for pgid in list(_RUNNING):
            kill_tree(pgid)


class Preloaded:
    """Runs the engine's CLI (``grader.runners.single.cli.main(ARGS)``, the same arguments as
    ``python -m grader ARGS``) in processes forked from a server that has imported torch,
    the reference and the grader once (:mod:`grader.sandbox.forkserver`, the same
    mechanism as the workers' zygote).

    Half of a fresh ``python -m grader``'s CPU time is those imports; in a class they are
    paid once instead of once per student. Each forked grading is what a fresh process
    would be: its own session, its own log as stdout/stderr, no stdin, and the same
    wall-time limit and whole-tree kill. Its arguments and environment (the seed is in
    ``$GRADER_SEED``) travel over the server's socket, never on a command line.
    """

    def __init__(self, extra_env: dict[str, str] | None = None, *, seed: int | None = None,
                 public_only: bool = False) -> None:
        """With ``seed``, the server also builds the class's cases and their reference
        outputs once (:func:`grader.checks.prepare_class`) for every grading it forks. The
        seed goes down the server's stdin: its environment, unlike its children's, can be
        read in ``/proc/PID/environ`` for as long as it runs."""
        env = single_thread_env()
        env.update(extra_env or {})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
        self.env = dict(env)
        if seed is not None:
            env[_PREPARE_ENV] = "public" if public_only else "hidden"
        self.server = forkserver.Server("grader.runners.classmode.processes", env)
        if seed is not None:
            self.server.proc.stdin.write(f"{int(seed)}\n".encode())
            self.server.proc.stdin.flush()
        self.lock = threading.Lock()

    def run(self, args: Sequence[str], *, timeout: float, log: Path, cwd: Path,
            cpus: set[int] | None = None, env: dict[str, str] | None = None) -> RunResult:
        """``python -m grader ARGS`` forked, with ``env`` added to the server's environment."""
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with self.lock:
            if not self.server.wait_ready():
                raise RuntimeError(f"class mode's fork server did not start (exit {self.server.proc.poll()})")
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            proc = forkserver.request(self.server.socket, [null, out, out],
                                      {"cwd": str(cwd), "args": list(args), "cpus": sorted(cpus or []),
                                       "env": {**self.env, **(env or {})}})
        finally:
            os.close(out)
            os.close(null)
        if proc is None:
            raise RuntimeError(f"class mode's fork server stopped (exit {self.server.proc.poll()})")
        with _RUNNING_LOCK:
            _RUNNING.add(proc.pid)
        rc = None
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if rc is None:  # past the limit (or interrupted): unreaped by its minder, its pid is its own
                kill_tree(proc.pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc.pid)
        timed_out = rc is None
        if timed_out:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        proc.close()
        return RunResult(returncode=None if timed_out else rc, timed_out=timed_out,
                         seconds=time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the server and reap it (its children's CPU time then counts as ours)."""
        self.server.close()


#: In the server's environment: "hidden" or "public", the checks to prepare for the class
#: whose seed comes first on its stdin (not the seed itself).
_PREPARE_ENV = "GRADER_CLASS_PREPARE"


def _preload() -> None:
    """What every grading imports, imported once in the server."""
    import torch

    torch.set_num_threads(1)
    import attnmask  # noqa: F401 -- imported here once, for every child

    from ... import engine, report  # noqa: F401
    from ..single import cli  # noqa: F401

    engine.load_registry()  # the checks and their judges
    # What a grading imports on the way (the sandbox's side, the report's rich console).
    import rich.console  # noqa: F401
    import rich.progress  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401

    from ... import diagnose, verdicts  # noqa: F401
    from ...sandbox import channel, supervisor, worker  # noqa: F401


def _prepare() -> None:
    """The class's cases and reference outputs, built once for every grading forked from
    here; the class's seed is the first line on stdin (see :class:`Preloaded`)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            return  # closed before a seed came: nothing to prepare
        line += chunk
    from ... import checks

    checks.prepare_class(int(line), hidden=os.environ.get(_PREPARE_ENV) != "public")


def _grade(req: dict, extra: list[int]) -> int:
    """The server's body: one grading, ``python -m grader ARGS`` in a forked child."""
    from ..single import cli

    return cli.main([str(a) for a in req["args"]])


def single_thread_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for one grading process: one BLAS/OpenMP thread, so N workers use
    N cores instead of fighting over them."""
    env = dict(os.environ if base is None else base)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NO_COLOR", "1")
    return env


def log_tail(log: Path, limit: int = 300) -> str:
    """The last meaningful line of a log, for a one-line message."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


if __name__ == "__main__":  # class mode's grading server, started by Preloaded
    _preload()
    if os.environ.get(_PREPARE_ENV):
        _prepare()
    forkserver.serve(sys.argv[1], _grade)
    sys.stdout.flush()
    os._exit(0)  # skip tearing torch down: nothing of ours is left to clean up
