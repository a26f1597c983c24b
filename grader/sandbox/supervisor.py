"""Worker processes: start them early, feed them a job, watch them, kill them.

Each worker runs in its own session (process group) with a scrubbed
environment, a fresh temporary folder as cwd, stdout/stderr going to files, and
a status pipe on which it reports progress one line at a time. The parent waits
on that pipe with deadlines: the load phase gets ``load_timeout``, each
exercise ``timeout`` plus a grace period (the worker stops a slow exercise
itself; the grace is for code that ignores that). Whenever a worker ends, its
whole session is killed, so stray children cannot outlive grading.

Every worker is forked from a zygote (:mod:`grader.sandbox.zygote`) inside
bubblewrap, into namespaces of its own; it measures them and says so on its
"ready" line, which :attr:`Worker.measured` keeps. A confined worker that does
not hold is never given student code.

:func:`run` drives as many workers as needed: when one dies or is killed in the
middle of an exercise, that exercise is charged and a fresh worker grades the
rest.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from . import allowlist, cgroups, jobwire, namespaces, procs, status, zygote
from .forkserver import Server
from .limits import Limits, worker_env

STARTUP_TIMEOUT = 120.0  # importing torch on a loaded machine; a grader problem if exceeded
TAIL_CHARS = 1000
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

    def start(self, memory_bytes: int | None = None) -> str | None:
        """Fork the worker; None, or why it could not be had. A confined worker is moved into a
        cgroup of its own (:mod:`grader.sandbox.cgroups`) bounding its memory to ``memory_bytes``
        and its processes, before it is given its job."""
        if isinstance(self.server, Server) and not self.server.wait_ready():
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
        self.proc = zygote.spawn(self.socket, stdout=self._stdout.fileno(), stderr=self._stderr.fileno(),
                                 status=self._status_w, results=results, header=header)
        os.close(results)
        os.close(self._status_w)
        self._status_w = -1
        if self.proc is None:
            return "the workers' zygote did not answer"
        if self.confined:
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

    def send(self, job: Any) -> None:
        """Write the job to the worker's stdin from a thread (the pipe may be full until it reads)."""
        data = jobwire.dumps(job)

        def write() -> None:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass

        threading.Thread(target=write, daemon=True).start()

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


_DUMP = re.compile(r"Fatal Python error.*?(\nExtension modules:[^\n]*|\Z)", re.S)
_FRAME = re.compile(r'^\s*File "<(.+?)>", line (\d+)')


def crash_site_in(text: str) -> str | None:
    """The student's innermost line in a faulthandler dump ("most recent call first")."""
    dump = text[text.rfind("Fatal Python error"):] if "Fatal Python error" in text else ""
    for line in dump.splitlines():
        m = _FRAME.match(line)
        if m and not m.group(1).startswith("frozen"):
            return f"line {m.group(2)} of {m.group(1)}"
    return None


def receive(path: Path, offset: int = 0, length: int | None = None) -> Any:
    """:func:`grader.sandbox.channel.decode` for ``length`` bytes at ``offset`` of a file whose
    bytes student code wrote (all of it if no length).

    Opened without following links or blocking (a symlink to one of our files,
    a FIFO that never answers), and read only if it is a plain file.
    """
    from . import channel

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise channel.ChannelError("the worker wrote no result (or not as a plain file)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise channel.ChannelError("the worker's result is not a plain file")
        length = st.st_size - offset if length is None else length
        if message := channel.too_big(length):
            raise channel.ChannelError(message)
        data = os.pread(fd, length, offset) if length > 0 else b""
        if len(data) != length:
            raise channel.ChannelError("the worker's result was cut short")
        return channel.decode(data)
    finally:
        os.close(fd)


def receive_record(results: Path, where: str) -> Any:
    """The record a worker announced as ``OFFSET LENGTH`` in its ``results`` file (see
    :class:`grader.sandbox.channel.Log`)."""
    from . import channel

    offset, length = channel.Log.parse(where)
    return receive(results, offset, length)


def output_tail(tmp: Path, keep: int = TAIL_CHARS, width: int = 200) -> str:
    """What student code printed: the start and the end, long lines cut."""
    parts = []
    for name in ("stdout.txt", "stderr.txt"):
        try:
            with open(tmp / name, "rb") as f:
                data = f.read(8 * keep)
                size = os.fstat(f.fileno()).st_size
                if size > 8 * keep:
                    f.seek(size - 8 * keep)
                    data += f.read()
        except OSError:
            continue
        # The crash dump names grader internals; the crash message already gives the student's line.
        text = _DUMP.sub("[a crash dump, left out]", data.decode("utf-8", "replace"))
        if not text.strip():
            continue
        if size > 2 * keep:
            text = f"{text[:keep]}\n[... {size - 2 * keep} characters left out ...]\n{text[-keep:]}"
        lines = [line if len(line) <= width else line[:width] + " [...]" for line in text.splitlines()]
        parts.append(f"--- {name[:-4]} ---\n" + "\n".join(lines).rstrip())
    return "\n".join(parts)


class Handler(Protocol):
    """What :func:`run` reports, as it happens."""

    def loaded(self, data: Any) -> None: ...  # dict from the worker, or a ChannelError
    def check(self, ei: int, ci: int, outcomes: Any) -> None: ...  # list[Outcome] or ChannelError
    def exercise_done(self, ei: int) -> None: ...
    def exercise_failed(self, ei: int, reason: str) -> None: ...
    def load_failed(self, reason: str) -> None: ...
    def grader_failed(self, reason: str) -> None: ...


def run(make_job: Callable[[list[int]], Any], pending: list[int], found_of: Callable[[], set[int] | None],
        limits: Limits, handler: Handler, tmp: Path, server: Server | str, confined: bool,
        cell_label: Callable[[int], str] = str) -> dict[str, str]:
    """Grade exercises ``pending`` (indices, in order), forking workers from ``server`` as needed.

    ``make_job(indices)`` builds the job for a worker; ``found_of()`` gives the
    indices the first load found (None if loading failed). Returns what the first
    worker measured of its sandbox (empty if none started).
    """
    left = list(pending)
    n = 0
    measured: dict[str, str] = {}
    # What the worker's cgroup bounds (where it has one): the RSS watch's bound, and its tmpfs.
    memory = None if limits.memory_mb is None else (limits.memory_mb + 1024 + 256) * 2**20
    while left:
        worker = Worker(tmp, server, confined)
        n += 1
        try:
            why = worker.start(memory)
            if why is not None:
                handler.grader_failed(why)
                return measured
            job = make_job(left)
            worker.sites = {c.filename.strip("<>") for c in getattr(job, "cells", ())}
            worker.secrets = list(getattr(job, "secrets", ()))
            worker.send(job)
            state = _Drive(worker, limits, handler, cell_label, left, first=(n == 1))
            state.drive()
        finally:
            worker.stop()
        measured = measured or worker.measured
        found = found_of()
        if state.fatal or found is None:
            return measured
        left = [i for i in left if i not in state.finished and i in found]
        if state.bye:
            # The worker said it finished: anything not reported is lost for good.
            for i in left:
                handler.exercise_failed(i, "the worker finished without reporting it")
            return measured
    return measured


class _Drive:
    """Follow one worker's status lines until it says bye, dies or runs out of time."""

    def __init__(self, worker: Worker, limits: Limits, handler: Handler, cell_label, pending: list[int],
                 *, first: bool):
        self.w, self.limits, self.h = worker, limits, handler
        self.cell_label, self.pending, self.first = cell_label, pending, first
        self.phase = "startup"  # startup -> loading -> grading -> bye
        self.cell: int | None = None
        self.current: int | None = None  # exercise in progress
        self.finished: set[int] = set()
        self.fatal = False
        self.bye = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        # Absolute: set once per phase and per exercise, and never past the grading's own end.
        self.until = float("inf")
        self.started: set[int] = set()
        self.checked: set[tuple[int, int]] = set()

    def _exercise_deadline(self) -> None:
        self.deadline = min(time.monotonic() + self.limits.timeout + self.limits.grace, self.until)

    def handle(self, line: str) -> None:
        """One status line (:mod:`grader.sandbox.status`); ChannelError if it breaks the protocol:
        unknown, out of order, or an event said twice (nothing may move a deadline twice)."""
        from . import channel  # imports torch: not needed to start a worker

        word, args = status.parse(line)
        rest = [str(a) for a in args]
        ei = args[0] if args and word not in ("ready", "refused") else None
        if word == "refused" and self.phase == "startup":
            self.fatal = True
            self.h.grader_failed(allowlist.refusal(" ".join(rest)[:200] or "its namespaces were refused"))
            self.phase = "bye"
            return
        if word == "ready" and self.phase == "startup":
            if self.w.confined:
                pairs = [r.split("=", 1) for r in rest[:8] if "=" in r and len(r) <= 40]
                self.w.measured = {k: v for k, v in pairs}
                self.w.measured["limits"] = self.w.limited[:200]
                broken = namespaces.holds(self.w.measured, getattr(self.w, "secrets", None))
                if broken is not None:
                    self.w.stop()
                    self.fatal = True
                    self.h.grader_failed(f"the sandbox did not hold ({broken}); no student code was run. "
                                         f"Fix: {allowlist.LAYOUT_HINT}")
                    self.phase = "bye"
                    return
            self.phase = "loading"
            self.deadline = time.monotonic() + self.limits.load_timeout
        elif word == "cell" and self.phase == "loading":
            self.cell = ei
        elif word == "loaded" and self.phase == "loading":
            self.phase = "grading"
            per_exercise = self.limits.timeout + self.limits.grace
            self.until = time.monotonic() + (len(self.pending) + 1) * per_exercise
            self._exercise_deadline()
            if self.first:
                try:
                    self.h.loaded(channel.loaded_from_data(receive_record(self.w.results, args[0])))
                except channel.ChannelError as e:
                    self.h.loaded(e)
        elif word == "start" and self.current is None and ei in self.pending and ei not in self.started:
            self.current = ei
            self.started.add(ei)
            self._exercise_deadline()
        elif word == "check" and ei == self.current is not None and (ei, args[1]) not in self.checked:
            self.checked.add((ei, args[1]))
            try:
                data = receive_record(self.w.results, args[2])
                if type(data) is not list:
                    raise channel.ChannelError("a check's record is not a list")
                outcomes: Any = [channel.outcome_from_data(d) for d in data]
            except channel.ChannelError as e:
                outcomes = e
            self.h.check(ei, args[1], outcomes)
        elif word == "done" and ei == self.current is not None:
            self.finished.add(ei)
            self.current = None
            self.h.exercise_done(ei)
            self._exercise_deadline()
        elif word == "bye" and self.phase == "grading" and self.current is None:
            self.phase = "bye"
            self.bye = True
        else:
            raise channel.ChannelError(f"a status line out of order ({word})")

    def drive(self) -> None:
        limits = self.limits
        memory = None if limits.memory_mb is None else limits.memory_mb * 2**20 + 1024 * 2**20
        while self.phase != "bye":
            try:
                for line in self.w.lines(min(0.05, max(self.deadline - time.monotonic(), 0))):
                    if line.strip():
                        self.handle(line)
                    if self.phase == "bye":
                        return
                alive = self.w.alive()
                if not alive:
                    # Drain what it said before dying, then charge whatever it was doing.
                    for line in self.w.lines(0):
                        if line.strip():
                            self.handle(line)
            except Exception:  # noqa: BLE001 -- any byte of the worker's side is the submission's, not a crash
                self.w.stop()
                self.fail(status.UNREADABLE)
                return
            if self.phase == "bye":
                return
            if not alive:
                self.fail(self.w.how_it_ended())
                return
            if memory and self.w.rss_bytes() > memory:
                self.w.stop()
                self.fail(f"used more than {limits.memory_mb} MiB of memory and was stopped")
                return
            if time.monotonic() > self.deadline:
                self.w.stop()
                if self.phase == "loading":
                    self.fail(f"did not finish within {limits.load_timeout:g} s and was stopped")
                else:
                    self.fail(f"did not finish within {limits.timeout:g} s and was stopped "
                              "(an infinite loop, or waiting for input?)")
                return

    def fail(self, how: str) -> None:
        if self.phase == "startup":
            self.fatal = True
            self.h.grader_failed(f"the grading worker could not start: it {how}")
        elif self.phase == "loading":
            self.fatal = True
            where = "" if self.cell is None else f" while running {self.cell_label(self.cell)}"
            self.h.load_failed(f"your code {how}{where}")
        else:
            # Between two exercises (a stray thread?): charge the next one, so every restart makes progress.
            current = self.current
            if current is None:
                current = next((i for i in self.pending if i not in self.finished), None)
            if current is not None:
                self.finished.add(current)
                self.h.exercise_failed(current, f"your code {how}")
