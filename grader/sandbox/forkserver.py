"""Fork servers: torch imported once, and a fresh-looking process forked per request.

A new interpreter spends a second or more importing torch. A fork server pays that
once and forks a child per request, which then looks like what a fresh process
would have been. One mechanism serves two roles:

* the workers' **zygote** (:mod:`grader.sandbox.zygote`), inside bubblewrap, which
  imports torch and the worker's modules only, and whose children become sandbox
  workers;
* class mode's **grading server** (:class:`grader.runners.classmode.processes.Preloaded`),
  which imports torch, the reference and the grader, and whose children each grade
  one student with the engine's CLI.

For each connection the server

1. receives the child's stdin, stdout and stderr (and any further descriptors, such
   as a worker's status pipe) over SCM_RIGHTS, with a JSON header: the child's
   folder, and, as its role needs, its environment, allowed CPUs and arguments;
2. forks a *minder* for it, which forks the child. The child gets a session of its
   own, exactly those descriptors, that folder and environment, and runs the role's
   body;
3. the minder answers ``pid N``, then ``rss BYTES`` now and then (the resident memory of
   the child, or of a confined worker's process 1), then ``exit CODE`` once the child has exited (CODE
   negative for a signal, as Popen's returncode). If the connection closes first --
   the asker died or gave up at its time limit -- it kills the child's whole session.

A child's parent is its minder, so a child that kills its parent ends its own
request only, never the server the others come from. The server is single-threaded
(so fork is safe), not dumpable (a child running as the same user cannot read or
patch its memory), and exits, killing what it forked, when its stdin closes; inside
the sandbox its socket is out of its children's sight. Hand-written rather than ``multiprocessing``'s
forkserver: that one cannot hand a child another process's descriptors, a session
and a user of its own, or report its exit to a process it did not start.
"""

from __future__ import annotations

import ctypes
import gc
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

from .procs import ChildWakeups, children, descendants, kill_session, stop_server

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
        self.rss = 0  # bytes, as the minder last said
        self._buf = pending  # what came after the "pid" line, if anything

    def _read(self, timeout: float) -> None:
        if self.returncode is not None or self.conn is None:
            return
        ready, _, _ = select.select([self.conn], [], [], max(timeout, 0))
        if ready:
            try:
                chunk = self.conn.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:  # the minder is gone without a word: it took the worker with it
                self._buf += b"\nexit -9\n"
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > 64:  # no line of the minder's is this long
            lines, self._buf = [*lines, b"?"], b""
        for raw in lines:
            words = raw.decode("ascii", "replace").split()
            number = words[1] if len(words) == 2 and len(words[1]) <= 20 else ""
            if words[:1] == ["rss"] and number.isdigit():
                self.rss = int(number)
            elif words[:1] == ["exit"] and number.lstrip("-").isdigit() and abs(int(number)) < 256:
                self.returncode = int(number)
            elif raw.strip():
                self.returncode = -signal.SIGKILL
            if self.returncode is not None:
                self.close()
                return

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def end(self, timeout: float = 10.0) -> None:
        """Have the minder kill the child's session, and wait until the child is gone."""
        if self.conn is not None and self.returncode is None:
            try:
                self.conn.shutdown(socket.SHUT_WR)
                self.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.close()
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

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


#: A Unix socket's path must fit in ``sun_path``: 108 bytes on Linux, 104 on macOS, with its NUL.
SOCKET_PATH_MAX = 100


def socket_folder(prefix: str) -> Path:
    """A new folder (0700) for a server's socket: in the temporary folder where the socket's path
    fits a Unix socket's address, else in ``/tmp`` (a long ``TMPDIR`` would make it unreachable)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if len(os.fsencode(folder / "server.sock")) <= SOCKET_PATH_MAX:
        return folder
    folder.rmdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


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


class Server:
    """A fork server started as ``[PREFIX...] python FLAGS -m MODULE SOCKET [ARGS...]``, whose
    ``__main__`` imports what its children share and calls :func:`serve`. Its socket lies in
    a folder of its own (0700: only we can connect); ``inside`` is that folder as the server
    sees it (another path inside the sandbox)."""

    def __init__(self, module: str, env: dict[str, str], *, flags: tuple[str, ...] = (),
                 cwd: Path | None = None, prefix: tuple[str, ...] = (), inside: str | None = None,
                 args: tuple[str, ...] = (), folder: Path | None = None, python: str | None = None) -> None:
        self.dir = folder or socket_folder("grader-forkserver-")
        self.socket = self.dir / "server.sock"
        self.errors = open(self.dir / "stderr.txt", "w+b")  # noqa: SIM115 -- closed in close()
        argv = [*prefix, python or sys.executable, *flags, "-m", module,
                str(self.socket) if inside is None else f"{inside}/server.sock", *args]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     stderr=self.errors, cwd=cwd, start_new_session=True)
        self.ready: bool | None = None

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until the server serves its socket (False if it never does)."""
        if self.ready is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            self.ready = bool(ready) and self.proc.stdout.readline() == b"ready\n"
        return self.ready

    def failure(self) -> str:
        """The last line the server wrote on stderr (why it did not start), cut short."""
        try:
            self.errors.seek(max(0, os.fstat(self.errors.fileno()).st_size - 2000))
            lines = self.errors.read().decode("utf-8", "replace").strip().splitlines()
        except (OSError, ValueError):
            lines = []
        return lines[-1][:300] if lines else "it exited without a word"

    def close(self) -> None:
        """Stop the server (it kills anything it forked that is still running) and reap it."""
        stop_server(self.proc)
        self.errors.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------- the server


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
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


def _rss(pids: list[int]) -> int:
    """Bytes of memory that ``pids`` hold (resident), from /proc."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            pass
    return total


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
        alive, told = True, 0
        watched = [] if req.get("confined") else [pid]
        while True:
            ready, _, _ = select.select([conn, wakeups.r] if alive else [wakeups.r], [], [], 0.25)
            wakeups.drain()
            # A confined worker is the child's child (process 1 of its own pid namespace): found
            # once, not by a walk of /proc at every tick.
            watched = watched or children(pid)
            rss = _rss(watched)
            if alive and rss != told:
                try:
                    conn.sendall(f"rss {rss}\n".encode())
                    told = rss
                except OSError:
                    pass
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
                try:  # the asker may have closed only its sending side: it waits for this
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
    # What is imported stays shared with every child: the garbage collector, which would walk
    # (and so copy) those million objects in each child, leaves them alone from now on.
    gc.freeze()
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
