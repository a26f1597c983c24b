"""Running one grading: a subprocess or a fork-server child with a wall-time limit.

:func:`run_limited` runs a command in a session of its own; :class:`Preloaded` forks
the engine's CLI from a server that has imported torch and the grader once. Either
way a grading that runs past its limit is stopped by killing its whole process tree
(:func:`_kill_group`), including processes that moved to sessions of their own, and
:func:`kill_running` stops every grading still running when the class run is
interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


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
            _kill_group(proc.pid)
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
            _kill_group(pgid)


class Preloaded:
    """Runs the engine's CLI (``grader.cli.main(ARGS)``, the same arguments as
    ``python -m grader ARGS``) in processes forked from a server that has imported torch,
    the reference and the grader once.

    Half of a fresh ``python -m grader``'s CPU time is those imports; in a class they are
    paid once instead of once per student. Each forked grading is what a fresh process
    would be: its own session, its own log as stdout/stderr, no stdin, one thread, and the
    same wall-time limit and whole-tree kill. The server is ``python -m grader.classroom
    _forkserver``: single-threaded (fork is safe there), it forks on request and reports
    each child's pid and exit status on its stdout.
    """

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        env = single_thread_env()
        env.update(extra_env or {})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
        self.server = subprocess.Popen([sys.executable, "-m", "grader.classroom", "_forkserver"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                       bufsize=1)
        self.lock = threading.Lock()
        self.next_id = 0
        self.started: dict[int, int] = {}
        self.exited: dict[int, int] = {}
        self.changed = threading.Condition(self.lock)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.server.stdout:
            kind, rid, value = line.split()
            with self.changed:
                (self.started if kind == "started" else self.exited)[int(rid)] = int(value)
                self.changed.notify_all()
        with self.changed:  # the server is gone: nothing more will start or exit
            self.changed.notify_all()

    def _wait_for(self, table: dict[int, int], rid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while rid not in table:
                if self.server.poll() is not None:
                    raise RuntimeError(f"class mode's fork server stopped (exit {self.server.returncode})")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.changed.wait(0.5 if left is None else min(left, 0.5))
            return table.pop(rid)

    def run(self, args: Sequence[str], *, timeout: float, log: Path, cwd: Path,
            cpus: set[int] | None = None) -> RunResult:
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with self.lock:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.server.stdin.write(json.dumps({"id": rid, "args": list(args), "log": str(log),
                                                "cwd": str(cwd), "cpus": sorted(cpus or [])}) + "\n")
            self.server.stdin.flush()
        pid = self._wait_for(self.started, rid, None)
        with _RUNNING_LOCK:
            _RUNNING.add(pid)
        if cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError:
                pass
        rc = None
        try:
            rc = self._wait_for(self.exited, rid, timeout)
        finally:
            if rc is None:  # past the limit (or interrupted): still running, so its pid is its own
                _kill_group(pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(pid)
        timed_out = rc is None
        if timed_out:
            self._wait_for(self.exited, rid, None)
        return RunResult(returncode=None if timed_out else rc, timed_out=timed_out,
                         seconds=time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the server and reap it (its children's CPU time then counts as ours)."""
        stop_server(self.server)


class ChildWakeups:
    """A descriptor that becomes readable when a child exits (SIGCHLD through
    ``signal.set_wakeup_fd``): a fork server's select() wakes at once instead of polling."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        for fd in (self.r, self.w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.w)

    def drain(self) -> None:
        try:
            while os.read(self.r, 4096):
                pass
        except BlockingIOError:
            pass

    def undo_in_child(self) -> None:
        """In a forked child: signals as a fresh process has them, and neither end of the pipe."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.r)
        os.close(self.w)


def _forkserver() -> None:
    """``python -m grader.classroom _forkserver``: import once, fork a grading per request."""
    import select

    import torch

    torch.set_num_threads(1)
    import attnmask  # noqa: F401 -- imported here once, for every child
    from grader import cli, engine, report  # noqa: F401

    engine.load_registry()  # the checks and their judges
    # What a grading imports on the way (the sandbox's side, the report's rich console).
    import rich.console  # noqa: F401
    import rich.progress  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401

    from grader import channel, diagnose, integrity, sandbox, worker  # noqa: F401

    children: dict[int, int] = {}  # pid -> request id
    stdin = sys.stdin.fileno()
    wakeups = ChildWakeups()
    buf, eof = b"", False
    while not eof or children:
        ready, _, _ = select.select([wakeups.r] + ([] if eof else [stdin]), [], [], 1.0)
        wakeups.drain()
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            eof = not chunk
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    wakeups.undo_in_child()
                    _cli_in_child(req["args"], req["log"], req["cwd"], req.get("cpus"))
                children[pid] = req["id"]
                print("started", req["id"], pid, flush=True)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print("exited", children.pop(pid), os.waitstatus_to_exitcode(status), flush=True)


def _cli_in_child(args: list[str], log: str, cwd: str, cpus: list[int] | None = None) -> None:
    """Body of a forked grading: become a fresh-looking process, run the CLI, exit with its status.
    ``cpus``: its cores (--pin), set before it asks for its sandbox, which inherits them."""
    code = 1
    try:
        os.setsid()  # a session of its own, as start_new_session gives a subprocess
        if cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(cwd)
        from grader import cli

        code = cli.main(args)
    except SystemExit as e:  # argparse's usage errors
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 -- reported in the log, like a crashed interpreter
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _kill_group(pgid: int) -> None:
    """Kill the process group ``pgid`` and every process descended from its leader,
    including those that moved to sessions of their own (the grader's sandbox does), which
    a kill of the group alone would leave running when the grader is stopped for time."""
    for _ in range(2):  # a second pass for anything started while the first one ran
        for pid in [pgid, *_descendants(pgid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, ppid, pgrp, session, ... ([] if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return []
    return text[text.rfind(")") + 2:].split()


def _pids() -> list[int]:
    """Every process, from /proc (empty where there is no /proc)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def _descendants(root: int) -> list[int]:
    """Processes descended from ``root``, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        fields = _stat(pid)
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def session_members(sid: int) -> list[int]:
    """Processes in session ``sid`` (a sandbox's), e.g. children it left behind."""
    return [pid for pid in _pids() if _stat(pid)[3:4] == [str(sid)]]


def kill_session(sid: int) -> None:
    """SIGKILL every process in session ``sid`` and in process group ``sid``."""
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(sid, signal.SIGKILL)
    except OSError:
        pass


def stop_server(proc: subprocess.Popen) -> None:
    """Close a server's stdin (its sign to finish) and reap it; kill it if it lingers 30 s."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
