"""One worker process, seen from the parent: fork it from a zygote, bound it, give it its
job, read its status pipe, tell how it ended, and end it (like CPython's ``popen_forkserver``
beside ``forkserver``).

Each worker runs in its own session (process group) with a scrubbed
environment, a fresh temporary folder as cwd, stdout/stderr going to files, and
a status pipe on which it reports progress one line at a time. Whenever a worker
ends, its whole session is killed, so stray children cannot outlive grading.

Every worker is forked from a zygote (:mod:`grader.sandbox.zygote`) inside
bubblewrap, into namespaces of its own; it measures them and says so on its
"ready" line, which :attr:`Worker.measured` keeps. A confined worker that does
not hold is never given student code.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ..timing import Timing
from . import allowlist, cgroups, jobwire, namespaces, procs, status, zygote
from .forkserver import Server
from .limits import worker_env
from .readback import crash_site_in

_SIGNALS = {
    signal.SIGSEGV: "crashed with a segmentation fault (it read or wrote memory it does not own, "
                    "e.g. through ctypes)",
    signal.SIGABRT: "aborted (a C library gave up)",
    signal.SIGBUS: "crashed with a bus error",
    signal.SIGFPE: "crashed with a floating-point exception",
    signal.SIGKILL: "was killed (out of memory?)",
    signal.SIGILL: "crashed with an illegal instruction",
}


class Worker:
    """One worker, forked from ``server`` (a zygote, or the socket of class mode's) when
    :meth:`send` gives it its job. ``confined``: whether that zygote is in the sandbox."""

    def __init__(self, tmp: Path, server: Server | str, confined: bool):
        self.dir, self.server, self.confined = tmp, server, confined
        self.proc: zygote.Forked | None = None
        self.measured: dict[str, str] = {}
        self._sending: threading.Thread | None = None  # the last part's writer: parts go in order
        self.socket = server if isinstance(server, str) else str(server.socket)
        self.token = os.urandom(8).hex()
        # The worker's results: a file of this grading's, handed over as a descriptor (no folder)
        self.results = tmp / f"results-{self.token}.bin"
        self.work = tmp / f"work-{self.token}"
        self._stdout = open(tmp / "stdout.txt", "ab")  # noqa: SIM115 -- closed in stop()
        self._stderr = open(tmp / "stderr.txt", "ab")  # noqa: SIM115
        self.status, write_fd = os.pipe()
        self._status_w = write_fd
        self._lines = status.Lines()
        self._eof = False
        self.cgroup: cgroups.Cgroup | None = None
        self.limited = "none"  # what bounds its memory and processes, for the report (cgroups.Cgroup.make)
        self.sites: set[str] = set()  # the submission's own file names: a crash is placed in one of them
        self.secrets: list[str] = []  # the paths its job asks it to count (a path it sees is named)

    def start(self, memory_bytes: int | None = None, clock: Timing | None = None) -> str | None:
        """Fork the worker; None, or why it could not be had. A confined worker is moved into a
        cgroup of its own (:mod:`grader.sandbox.cgroups`) bounding its memory to ``memory_bytes``
        and its processes, before it is given its job. ``clock`` counts the phases."""
        clock = Timing() if clock is None else clock
        with clock.measure("zygote awaited"):
            ready = not isinstance(self.server, Server) or self.server.wait_ready()
        if not ready:
            return allowlist.startup_refusal(self.server.failure())
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        results = os.open(self.results, flags, 0o600)
        if self.confined:
            env = worker_env(Path(namespaces.WORK))
            env.update(HOME=namespaces.HOME, PYTHONPATH=allowlist.sandbox_pythonpath())
            header = {"cwd": "/tmp", "env": env, "confined": True}
        else:
            self.work.mkdir()
            header = {"cwd": str(self.work), "env": worker_env(self.work)}
        with clock.measure("worker forked"):
            self.proc = zygote.spawn(self.socket, stdout=self._stdout.fileno(), stderr=self._stderr.fileno(),
                                     status=self._status_w, results=results, header=header)
        os.close(results)
        os.close(self._status_w)
        self._status_w = -1
        if self.proc is None:
            return "the workers' zygote did not answer"
        if self.confined:
            with clock.measure("cgroup"):
                self._limit(memory_bytes)
        return None

    def _limit(self, memory_bytes: int | None) -> None:
        """Move the worker (it waits for its job: no student code has run) into a cgroup of its own."""
        self.cgroup, self.limited = cgroups.Cgroup.make(f"{cgroups.PREFIX}{os.getpid()}-{self.token}",
                                                        memory_bytes)
        if self.cgroup is None:
            return
        host = _host_pid(self.proc)
        try:
            if host is None:
                raise OSError("the worker's process was not found on the host")
            self.cgroup.add(host)  # first: whatever it forks from now on is inside too
            for child in procs.children(host):
                self.cgroup.add(child)
        except OSError as e:
            self.cgroup.remove()
            self.cgroup, self.limited = None, f"none: {e.strerror or e}"

    def send(self, part: Any, *, last: bool = False) -> None:
        """Write one part of the job (:func:`grader.sandbox.jobwire.frame`) to the worker's stdin
        from a thread (the pipe may be full until it reads), in the order given; ``last``: close
        the pipe after it."""
        data = jobwire.frame(part)
        before = self._sending

        def write() -> None:
            if before is not None:
                before.join()
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                if last:
                    self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass

        self._sending = threading.Thread(target=write, daemon=True)
        self._sending.start()

    def lines(self, wait: float) -> list[str]:
        """Status lines that arrived within ``wait`` seconds (maybe none)."""
        if self._eof:
            time.sleep(min(wait, 0.02))
            return []
        ready, _, _ = select.select([self.status], [], [], max(wait, 0))
        if not ready:
            return []
        chunk = os.read(self.status, 65536)
        if not chunk:
            self._eof = True
        return self._lines.feed(chunk)  # a line too long or not ASCII comes back as one parse() refuses

    def crash_site(self) -> str | None:
        try:
            with open(self.dir / "stderr.txt", "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
                site = crash_site_in(f.read().decode("utf-8", "replace"))
                # stderr is the submission's to write: a "dump" of its own must not say what it likes
                return site if site and site.split(" of ", 1)[1] in self.sites else None
        except OSError:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self) -> int:
        return self.proc.rss if self.proc is not None else 0

    def stop(self) -> None:
        """End the worker (closing its connection makes its minder kill its session, and its pid
        namespace dies with it), then drop its folders."""
        if self.proc is not None:
            self.proc.end()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        for f in (self._stdout, self._stderr):
            f.close()
        for fd in (self.status, self._status_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.results.unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)

    def how_it_ended(self) -> str:
        rc = self.proc.returncode
        if rc is None:
            return "stopped responding"
        if rc < 0:
            try:
                sig = signal.Signals(-rc)
            except ValueError:
                return f"was stopped by signal {-rc}"
            where = self.crash_site()
            return _SIGNALS.get(sig, f"was stopped by {sig.name}") + (f", at {where}" if where else "")
        return (f"ended the grading process (exit code {rc}): does it call os._exit() or "
                "kill its own process?")


def _host_pid(proc: zygote.Forked) -> int | None:
    """The host's pid of a worker forked by a zygote in bubblewrap (``proc.pid`` is the sandbox's):
    the child of one of the zygote's minders whose innermost pid is ``proc.pid``. The zygote's own
    host pid is its socket's peer (SO_PEERCRED: the process that listens)."""
    import socket
    import struct

    try:
        creds = proc.conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        server = struct.unpack("3i", creds)[0]
    except (OSError, AttributeError, struct.error):
        return None
    for minder in procs.children(server):
        for child in procs.children(minder):
            if procs.namespace_pids(child)[-1:] == [proc.pid]:
                return child
    return None
