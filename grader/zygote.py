"""A fork server for sandbox workers: torch imported once, a fresh-looking worker per request.

A grading's sandboxed worker is otherwise a new interpreter that imports torch and
warms its meta kernels, about 1.5 s of CPU per student, every student. In class mode
that is paid once: the class run starts one zygote,
``python -s -P -m grader.zygote SOCKET`` (the workers' own flags, a scrubbed
environment, ``PYTHONHASHSEED=0``), which imports torch and the worker's modules
only -- never the reference, the checks or any case -- and then serves SOCKET. For
each connection it

1. receives the new worker's stdin, stdout, stderr and status pipe (SCM_RIGHTS) and a
   JSON header: the worker's folder, environment, user switch and allowed CPUs;
2. forks a *minder* for it, which forks the worker. The worker becomes what
   ``python -m grader.worker`` would have been -- a session of its own, exactly those
   descriptors, that folder and environment -- and runs :func:`grader.worker.serve`,
   which switches user and sets limits itself;
3. the minder answers ``pid N``, then ``exit CODE`` once the worker has exited (CODE
   negative for a signal, as Popen's returncode). If the connection closes first -- the
   grading died or was killed for time -- it kills the worker's whole session.

The worker's parent is its minder, so a worker that kills its parent ends its own
grading only, not the zygote the other gradings' workers come from.

The zygote is single-threaded (so fork is safe), not dumpable (a worker running as
the same user cannot read or patch its memory), and exits, killing what it forked,
when its stdin closes. Nothing a worker does reaches the zygote's memory: each is a
copy-on-write child.

:func:`spawn` is the engine's side: :class:`grader.sandbox.Worker` uses it when
``GRADER_ZYGOTE`` names a socket, and starts a fresh interpreter when it does not or
when the zygote cannot be reached.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .processes import ChildWakeups, _descendants, _stat, kill_session, stop_server

#: Environment variable naming the zygote's socket, for the grading processes of a class run.
ZYGOTE_ENV = "GRADER_ZYGOTE"
_HEADER_MAX = 1 << 20
_PR_SET_DUMPABLE = 4


# --------------------------------------------------------------------------- the engine's side


class Forked:
    """A worker forked by the zygote: the part of ``subprocess.Popen`` the sandbox uses
    (``pid``, ``stdin``, ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, conn: socket.socket, pid: int, stdin, pending: bytes = b""):
        self.conn, self.pid, self.stdin = conn, pid, stdin
        self.returncode: int | None = None
        self._buf = pending  # what came after the "pid" line, if anything

    def _read(self, timeout: float) -> None:
        if self.returncode is not None or self.conn is None:
            return
        chunk = None
        if b"\n" not in self._buf:
            ready, _, _ = select.select([self.conn], [], [], max(timeout, 0))
            if not ready:
                return
            try:
                chunk = self.conn.recv(4096)
            except OSError:
                chunk = b""
            self._buf += chunk
        if b"\n" in self._buf:
            line = self._buf.split(b"\n", 1)[0].decode("ascii", "replace").split()
            ok = len(line) == 2 and line[0] == "exit" and line[1].lstrip("-").isdigit()
            self.returncode = int(line[1]) if ok else -signal.SIGKILL
            self._close()
        elif not chunk:  # the minder is gone without a word: it took the worker with it
            self.returncode = -signal.SIGKILL
            self._close()

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("grader.worker (forked)", timeout)
            self._read(min(left, 1.0))
        return self.returncode


def spawn(*, stdout: int, stderr: int, status: int, cwd: Path, env: dict[str, str],
          switch: list[str]) -> Forked | None:
    """Ask the zygote named by ``GRADER_ZYGOTE`` for a worker; None if there is none or it
    does not answer (the caller then starts a fresh interpreter). ``stdout``, ``stderr``,
    ``status``: descriptors the worker gets as 1, 2 and its status pipe."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stdin_r, stdin_w = os.pipe()
    try:
        conn.settimeout(10)
        conn.connect(path)
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        header = json.dumps({"cwd": str(cwd), "env": env, "switch": switch, "cpus": cpus}).encode()
        socket.send_fds(conn, [len(header).to_bytes(4, "big") + header], [stdin_r, stdout, stderr, status])
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(64)
            if not chunk:
                raise OSError("the zygote closed the connection")
            answer += chunk
        first, pending = answer.split(b"\n", 1)
        kind, pid = first.decode("ascii").split()
        if kind != "pid" or not pid.isdigit():
            raise OSError(f"unexpected answer {answer!r}")
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        os.close(stdin_r)
        os.close(stdin_w)
        return None
    os.close(stdin_r)
    return Forked(conn, int(pid), os.fdopen(stdin_w, "wb"), pending)


# --------------------------------------------------------------------------- the class run's side


class Zygote:
    """Start a zygote for a class run; :meth:`env` gives the variable its gradings need."""

    def __init__(self) -> None:
        from .sandbox import worker_env

        self.dir = Path(tempfile.mkdtemp(prefix="grader-zygote-"))  # 0700: only we can connect
        self.socket = self.dir / "zygote.sock"
        home = self.dir / "home"
        home.mkdir()
        env = worker_env(home)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        flags = ["-s", "-P"] if sys.version_info >= (3, 11) else ["-s"]
        self.proc = subprocess.Popen([sys.executable, *flags, "-m", "grader.zygote", str(self.socket)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=home,
                                     start_new_session=True)
        self.ready: bool | None = None

    def env(self) -> dict[str, str]:
        return {ZYGOTE_ENV: str(self.socket)}

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until the zygote serves its socket; False (with a note) if it never does,
        and the gradings then start their workers as fresh interpreters."""
        if self.ready is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            self.ready = bool(ready) and self.proc.stdout.readline() == b"ready\n"
            if not self.ready:
                print("grader: note: the worker zygote did not start; every worker imports torch itself "
                      "(slower, same grades)", file=sys.stderr)
        return self.ready

    def close(self) -> None:
        """Stop the zygote (it kills anything it forked that is still running) and reap it."""
        stop_server(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------- the zygote


def _forked_by_us(pid: int) -> bool:
    """Whether ``pid`` descends from this zygote: a worker, or something a worker started."""
    me = os.getpid()
    for _ in range(64):
        fields = _stat(pid)
        if len(fields) < 2 or not fields[1].isdigit():
            return False
        pid = int(fields[1])
        if pid == me:
            return True
        if pid <= 1:
            return False
    return True  # deeper than any grading goes: refuse


def _peer_allowed(conn: socket.socket) -> bool:
    """Only a grading may ask for workers: the socket's folder keeps other users out (0700);
    here, workers (same user when the grader is not root) are kept out too."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    import struct

    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))
    return uid == os.geteuid() and not _forked_by_us(pid)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    if not _peer_allowed(conn):
        raise ValueError("a worker may not ask for workers")
    conn.settimeout(2)  # a grading sends its request at once
    data, fds, _, _ = socket.recv_fds(conn, _HEADER_MAX + 4, 4)
    try:
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            if len(data) > _HEADER_MAX + 4:
                raise ValueError("header too long")
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("truncated request")
            data += chunk
        if len(fds) != 4:
            raise ValueError(f"expected 4 descriptors, got {len(fds)}")
        return json.loads(data[4:4 + int.from_bytes(data[:4], "big")]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _become_worker(req: dict, fds: list[int], others: set[int], wakeups) -> None:
    """In the forked child: turn into a fresh-looking worker and serve; never returns."""
    code = 1
    try:
        os.setsid()
        wakeups.undo_in_child()  # every other signal is as the zygote, a fresh interpreter, has it
        stdin, stdout, stderr, status = fds
        for fd in others:  # the zygote's listening socket and every other grading's connection
            try:
                os.close(fd)
            except OSError:
                pass
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        # The status pipe keeps its number; everything else beyond 2 goes.
        for fd in (stdin, stdout, stderr):
            if fd > 2 and fd != status:
                os.close(fd)
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a fresh process is
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        tempfile.tempdir = None  # TMPDIR is the worker's own folder now
        if req.get("cpus") and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, req["cpus"])
            except OSError:
                pass
        from . import worker

        sys.argv = [worker.__file__, str(status), *req["switch"]]  # as `python -m grader.worker` has it
        worker.serve(status, req["switch"][0] if req["switch"] else None)
        code = 0
    except BaseException:  # noqa: BLE001 -- reported on the worker's stderr, like a crashed interpreter
        import traceback

        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _mind(conn: socket.socket, req: dict, fds: list[int], others: set[int], wakeups: ChildWakeups) -> None:
    """A worker's minder, forked from the zygote for one request: forks the worker, tells
    the grading its pid, then its exit status; kills its session if the grading goes first.

    The worker's parent is its minder, not the zygote: a worker that kills its parent
    (``os.kill(os.getppid(), 9)``) ends only its own grading, never the zygote that every
    other student's sandbox comes from. Never returns."""
    code = 0
    try:
        for fd in others:  # the listening socket, the control pipe
            os.close(fd)
        wakeups.undo_in_child()
        wakeups = ChildWakeups()  # its own: the zygote's pipe would wake the zygote instead
        pid = os.fork()
        if pid == 0:
            _become_worker(req, fds, {conn.detach()}, wakeups)
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            kill_session(pid)
        alive = True
        while True:
            ready, _, _ = select.select([conn, wakeups.r] if alive else [wakeups.r], [], [], 1.0)
            wakeups.drain()
            if conn in ready:
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:  # the grading is gone (or killed for time): so is its worker
                    kill_session(pid)
                    alive = False
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                if alive:
                    try:
                        conn.sendall(f"exit {os.waitstatus_to_exitcode(wstatus)}\n".encode())
                    except OSError:
                        pass
                break
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


def serve(path: str) -> None:
    """The zygote's loop: a minder (and through it a worker) per connection."""
    import torch  # noqa: F401 -- the point of the zygote

    from . import worker

    worker.prepare()
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    control = sys.stdin.fileno()  # closed by the class run when it is done (or dies)
    wakeups = ChildWakeups()
    minders: set[int] = set()
    running = True
    while running or minders:
        ready, _, _ = select.select([listener, wakeups.r] + ([control] if running else []), [], [], 1.0)
        wakeups.drain()
        if control in ready and running and not os.read(control, 4096):
            running = False
            for pid in list(minders):
                for worker_pid in _descendants(pid):
                    kill_session(worker_pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if listener in ready:
            conn, _ = listener.accept()
            try:
                if not running:
                    raise ValueError("closing")
                req, fds = _recv_request(conn)
            except (OSError, ValueError):
                conn.close()
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _mind(conn, req, fds, {listener.fileno(), control}, wakeups)
                minders.add(pid)
                for fd in fds:
                    os.close(fd)
                conn.close()
        while minders:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            minders.discard(pid)
    listener.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m grader.zygote SOCKET (started by class mode)")
    serve(sys.argv[1])
    os._exit(0)  # skip tearing torch down: nothing is left to clean up
