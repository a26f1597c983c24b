"""Fork servers: torch imported once, and a fresh-looking process forked per request.

A new interpreter spends a second or more importing torch. A fork server pays that
once and forks a child per request, which then looks like what a fresh process
would have been. One mechanism serves two roles:

* the workers' **zygote**, ``python -s -P -m grader.sandbox.forkserver SOCKET``
  (the workers' own flags, a scrubbed environment, ``PYTHONHASHSEED=0``), which
  imports torch and the worker's modules only -- never the reference, the checks
  or any case -- and whose children become sandbox workers
  (:func:`grader.sandbox.worker.serve`); the supervisor asks it through :func:`spawn`
  when ``GRADER_ZYGOTE`` names its socket, and starts a fresh interpreter otherwise;
* class mode's **grading server** (:class:`grader.runners.processes.Preloaded`),
  which imports torch, the reference and the grader, and whose children each grade
  one student with the engine's CLI.

For each connection the server

1. receives the child's stdin, stdout and stderr (and any further descriptors, such
   as a worker's status pipe) over SCM_RIGHTS, with a JSON header: the child's
   folder, and, as its role needs, its environment, allowed CPUs and arguments;
2. forks a *minder* for it, which forks the child. The child gets a session of its
   own, exactly those descriptors, that folder and environment, and runs the role's
   body;
3. the minder answers ``pid N``, then ``exit CODE`` once the child has exited (CODE
   negative for a signal, as Popen's returncode). If the connection closes first --
   the asker died or gave up at its time limit -- it kills the child's whole session.

A child's parent is its minder, so a child that kills its parent ends its own
request only, never the server the others come from. The server is single-threaded
(so fork is safe), not dumpable (a child running as the same user cannot read or
patch its memory), refuses requests from its own descendants, and exits, killing
what it forked, when its stdin closes. Hand-written rather than ``multiprocessing``'s
forkserver: that one cannot hand a child another process's descriptors, a session
and a user of its own, or report its exit to a process it did not start.
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
from collections.abc import Callable
from pathlib import Path

from .limits import worker_env
from .procs import ChildWakeups, descendants, kill_session, stat_fields, stop_server

#: Environment variable naming the zygote's socket, for the grading processes of a class run.
ZYGOTE_ENV = "GRADER_ZYGOTE"
_HEADER_MAX = 1 << 20
_PR_SET_DUMPABLE = 4

#: A role's body, run in the forked child: (the request's header, the descriptors beyond
#: stdin, stdout and stderr) -> exit code.
Body = Callable[[dict, list[int]], int]


# --------------------------------------------------------------------------- the asking side


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
            self.close()
        elif not chunk:  # the minder is gone without a word: it took the worker with it
            self.returncode = -signal.SIGKILL
            self.close()

    def close(self) -> None:
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
                raise subprocess.TimeoutExpired("grader.sandbox.worker (forked)", timeout)
            self._read(min(left, 1.0))
        return self.returncode


def request(path: str | os.PathLike, fds: list[int], header: dict) -> Forked | None:
    """Ask the server at ``path`` for a child with ``fds`` as its stdin, stdout, stderr
    (and further descriptors); None if it does not answer. The caller keeps its copies
    of ``fds`` and closes them when it likes."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(10)
        conn.connect(str(path))
        data = json.dumps(header).encode()
        socket.send_fds(conn, [len(data).to_bytes(4, "big") + data], fds)
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(64)
            if not chunk:
                raise OSError("the fork server closed the connection")
            answer += chunk
        first, pending = answer.split(b"\n", 1)
        kind, pid = first.decode("ascii").split()
        if kind != "pid" or not pid.isdigit():
            raise OSError(f"unexpected answer {answer!r}")
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    return Forked(conn, int(pid), None, pending)


def spawn(*, stdout: int, stderr: int, status: int, cwd: Path, env: dict[str, str],
          switch: list[str]) -> Forked | None:
    """Ask the zygote named by ``GRADER_ZYGOTE`` for a worker; None if there is none or it
    does not answer (the caller then starts a fresh interpreter). ``stdout``, ``stderr``,
    ``status``: descriptors the worker gets as 1, 2 and its status pipe."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path:
        return None
    stdin_r, stdin_w = os.pipe()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    proc = request(path, [stdin_r, stdout, stderr, status],
                   {"cwd": str(cwd), "env": env, "switch": switch, "cpus": cpus})
    os.close(stdin_r)
    if proc is None:
        os.close(stdin_w)
        return None
    proc.stdin = os.fdopen(stdin_w, "wb")
    return proc


class Server:
    """A fork server started as ``python FLAGS -m MODULE SOCKET``, whose ``__main__``
    imports what its children share and calls :func:`serve`. Its socket lies in a
    folder of its own (0700: only we can connect)."""

    def __init__(self, module: str, env: dict[str, str], *, flags: tuple[str, ...] = (),
                 cwd: Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="grader-forkserver-"))
        self.socket = self.dir / "server.sock"
        argv = [sys.executable, *flags, "-m", module, str(self.socket)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     cwd=cwd, start_new_session=True)
        self.ready: bool | None = None

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until the server serves its socket (False if it never does)."""
        if self.ready is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            self.ready = bool(ready) and self.proc.stdout.readline() == b"ready\n"
        return self.ready

    def close(self) -> None:
        """Stop the server (it kills anything it forked that is still running) and reap it."""
        stop_server(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Zygote(Server):
    """The workers' zygote, for a class run; :meth:`env` gives the variable its gradings need."""

    def __init__(self) -> None:
        home = Path(tempfile.mkdtemp(prefix="grader-zygote-home-"))
        env = worker_env(home)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        flags = ("-s", "-P") if sys.version_info >= (3, 11) else ("-s",)
        super().__init__("grader.sandbox.forkserver", env, flags=flags, cwd=home)
        self.home = home

    def env(self) -> dict[str, str]:
        return {ZYGOTE_ENV: str(self.socket)}

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """As :meth:`Server.wait_ready`; if it never is, the gradings start their workers as
        fresh interpreters, and a note says so."""
        if self.ready is None and not super().wait_ready(timeout):
            print("grader: note: the worker zygote did not start; every worker imports torch itself "
                  "(slower, same grades)", file=sys.stderr)
        return bool(self.ready)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.home, ignore_errors=True)


# --------------------------------------------------------------------------- the server


def _forked_by_us(pid: int) -> bool:
    """Whether ``pid`` descends from this server: a child, or something a child started."""
    me = os.getpid()
    for _ in range(64):
        fields = stat_fields(pid)
        if len(fields) < 2 or not fields[1].isdigit():
            return False
        pid = int(fields[1])
        if pid == me:
            return True
        if pid <= 1:
            return False
    return True  # deeper than any grading goes: refuse


def _peer_allowed(conn: socket.socket) -> bool:
    """Only the server's owner may ask for children: the socket's folder keeps other users
    out (0700); here, its own children (same user when the grader is not root) are kept out too."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    import struct

    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))
    return uid == os.geteuid() and not _forked_by_us(pid)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    if not _peer_allowed(conn):
        raise ValueError("a child may not ask for children")
    conn.settimeout(2)  # the asker sends its request at once
    data, fds, _, _ = socket.recv_fds(conn, _HEADER_MAX + 4, 8)
    try:
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            if len(data) > _HEADER_MAX + 4:
                raise ValueError("header too long")
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("truncated request")
            data += chunk
        if len(fds) < 3:
            raise ValueError(f"expected stdin, stdout and stderr, got {len(fds)} descriptors")
        header = json.loads(data[4:4 + int.from_bytes(data[:4], "big")])
        if not isinstance(header, dict) or not isinstance(header.get("cwd"), str):
            raise ValueError("a header without the child's folder")
        return header, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _become(req: dict, fds: list[int], others: set[int], wakeups: ChildWakeups, body: Body) -> None:
    """In the forked child: turn into a fresh-looking process and run ``body``; never returns."""
    code = 1
    try:
        os.setsid()
        wakeups.undo_in_child()  # every other signal is as the server, a fresh interpreter, has it
        stdin, stdout, stderr, *extra = fds
        for fd in others:  # the listening socket and the connection
            try:
                os.close(fd)
            except OSError:
                pass
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in (stdin, stdout, stderr):  # the extra descriptors keep their numbers
            if fd > 2 and fd not in extra:
                os.close(fd)
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a fresh process is
        os.chdir(req["cwd"])
        if isinstance(req.get("env"), dict):
            os.environ.clear()
            os.environ.update(req["env"])
            tempfile.tempdir = None  # TMPDIR is the child's own now
        if req.get("cpus") and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, req["cpus"])
            except OSError:
                pass
        code = body(req, extra)
    except SystemExit as e:  # argparse's usage errors
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 -- reported on the child's stderr, like a crashed interpreter
        import traceback

        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def _mind(conn: socket.socket, req: dict, fds: list[int], others: set[int], wakeups: ChildWakeups,
          body: Body) -> None:
    """A child's minder, forked from the server for one request: forks the child, tells
    the asker its pid, then its exit status; kills its session if the asker goes first.
    Never returns."""
    code = 0
    try:
        for fd in others:  # the listening socket, the control pipe
            os.close(fd)
        wakeups.undo_in_child()
        wakeups = ChildWakeups()  # its own: the server's pipe would wake the server instead
        pid = os.fork()
        if pid == 0:
            _become(req, fds, {conn.detach()}, wakeups, body)
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
                if not data:  # the asker is gone (or gave up at its time limit): so is the child
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


def serve(path: str, body: Body) -> None:
    """The server's loop: a minder (and through it a child running ``body``) per connection,
    until stdin closes. Call it once the modules the children share are imported."""
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    control = sys.stdin.fileno()  # closed by whoever started us when it is done (or dies)
    wakeups = ChildWakeups()
    minders: set[int] = set()
    running = True
    while running or minders:
        ready, _, _ = select.select([listener, wakeups.r] + ([control] if running else []), [], [], 1.0)
        wakeups.drain()
        if control in ready and running and not os.read(control, 4096):
            running = False
            for pid in list(minders):
                for child in descendants(pid):
                    kill_session(child)
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
                    _mind(conn, req, fds, {listener.fileno(), control}, wakeups, body)
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


def _become_worker(req: dict, extra: list[int]) -> int:
    """The zygote's body: be what ``python -m grader.sandbox.worker STATUS [SWITCH]`` is."""
    from . import worker

    if len(extra) != 1 or not isinstance(req.get("switch"), list):
        raise ValueError("a worker needs its status pipe and its user switch")
    status, switch = extra[0], req["switch"]
    sys.argv = [worker.__file__, str(status), *switch]  # as `-m grader.sandbox.worker` has it
    worker.serve(status, switch[0] if switch else None)
    return 0


if __name__ == "__main__":  # the workers' zygote
    if len(sys.argv) != 2:
        sys.exit("usage: python -m grader.sandbox.forkserver SOCKET (started by class mode)")
    import torch  # noqa: F401 -- the point of the zygote

    from . import worker

    worker.prepare()
    serve(sys.argv[1], _become_worker)
    os._exit(0)  # skip tearing torch down: nothing is left to clean up
