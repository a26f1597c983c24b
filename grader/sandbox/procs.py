"""Processes, read from ``/proc``: who descends from whom, and killing them.

The one place that walks ``/proc`` (Linux; elsewhere every walker finds nothing).
A fork server's minder kills a worker's session, class mode kills a grading's
whole tree, and the fork servers wake on their children's exits
(:class:`ChildWakeups`). Only the standard library is imported here.
"""

from __future__ import annotations

import os
import signal
import subprocess


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, ppid, pgrp, session, ... ([] if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return []
    return text[text.rfind(")") + 2:].split()


def pids() -> list[int]:
    """Every process, from /proc (empty where there is no /proc)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def descendants(root: int) -> list[int]:
    """Processes descended from ``root``, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        fields = stat_fields(pid)
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``: from its threads' ``children`` files (a few small
    reads), or, where the kernel has none, from a walk of every process."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(n) for n in f.read().split()]
        return found
    except FileNotFoundError:
        if os.path.exists(f"/proc/{pid}"):  # no CONFIG_PROC_CHILDREN (or a thread just ended)
            return [p for p in pids() if stat_fields(p)[1:2] == [str(pid)]]
        return []
    except (OSError, ValueError):
        return [p for p in pids() if stat_fields(p)[1:2] == [str(pid)]]


def namespace_pids(pid: int) -> list[int]:
    """``NSpid`` of ``pid``: its pid in each pid namespace it is in, the host's first ([] if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def session_members(sid: int) -> list[int]:
    """Processes in session ``sid`` (a sandbox's), e.g. children it left behind."""
    return [pid for pid in pids() if stat_fields(pid)[3:4] == [str(sid)]]


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


def kill_tree(pgid: int) -> None:
    """Kill the process group ``pgid`` and every process descended from its leader,
    including those that moved to sessions of their own (the grader's sandbox does), which
    a kill of the group alone would leave running when the grader is stopped for time."""
    for _ in range(2):  # a second pass for anything started while the first one ran
        for pid in [pgid, *descendants(pgid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


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
