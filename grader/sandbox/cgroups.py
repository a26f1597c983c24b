"""A cgroup per worker: its memory and its processes, counted by the kernel.

The worker's own limits leave things out: ``RLIMIT_AS`` does not count a tmpfs's or a memfd's
pages, the parent's RSS watch does not either, and ``RLIMIT_NPROC`` does not bind a process whose
user on the host is root (a worker's uid maps back to the grader's). A cgroup counts everything
its processes hold -- anonymous memory, tmpfs and memfd pages, page cache -- and every process
and thread they start. The grading process (outside the sandbox) makes one per worker, moves
the worker into it before the worker is given its job (so before any student code runs), and
removes it when the worker has ended. What it does on each kind of machine:

* **cgroup v2** (a ``cgroup2`` mount where the grader's own cgroup delegates ``memory`` and
  ``pids`` to a child): ``memory.max``, ``memory.swap.max`` = 0, ``pids.max``;
* **cgroup v1** (the ``memory`` and ``pids`` controllers mounted as hierarchies of their own,
  as on this project's grading machine, whose ``unified`` v2 tree holds no controller):
  ``memory.limit_in_bytes`` (which also counts tmpfs and memfd pages) and ``pids.max``;
* **neither** (no cgroup file system, or not writable by this user: a student's laptop
  without delegation): no cgroup. The worker then has only its own limits (``RLIMIT_AS``,
  the parent's RSS watch, a bounded tmpfs, no ``memfd_create``: see
  :mod:`grader.sandbox.syscalls`), and as root, whom ``RLIMIT_NPROC`` does not bind, the
  ``pid_max`` of its own pid namespace (300 processes, Linux 6.14 on:
  :func:`grader.sandbox.namespaces.per_namespace_pid_max`; before 6.14, none); the report's
  isolation block says so (``limits``, and ``pidmax`` as the worker read it).

The v2 path has never run on this project's grading machine, and cannot: its ``memory`` and
``pids`` controllers are bound to v1 hierarchies, and a controller serves one hierarchy at a
time, so the ``unified`` v2 tree offers none (``cgroup.controllers`` lists only ``hugetlb``).
A ``cgroup2`` mounted in a namespace of its own is the same single v2 hierarchy, with the same
controllers; moving ``memory`` and ``pids`` over means unmounting the v1 hierarchies that the
machine's other processes live in. ``tests/test_sandbox_attacks.py`` drives this module's v2
branch against a v2-shaped folder (the files it writes, the order, the cleanup), not the kernel.

Hand-written rather than a library: the few files written here are the whole interface, and
no maintained Python package drives both cgroup versions without systemd.
Only the standard library is imported here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Processes and threads a worker may have at once (torch's threads, a student's few helpers).
PIDS = 64


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, super options) of every cgroup mount."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                i = fields.index("-")
                fstype = fields[i + 1]
                if fstype in ("cgroup", "cgroup2"):
                    found.append((fields[4], fstype, set(fields[i + 3].split(","))))
    except (OSError, ValueError, IndexError):
        pass
    return found


def _own() -> dict[str, str]:
    """This process's cgroup per hierarchy: {"": v2 path, "memory": v1 path, ...}."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class Cgroup:
    """One worker's cgroup folders (one for v2; memory's and pids' for v1)."""

    def __init__(self, folders: list[Path], kind: str):
        self.folders, self.kind = folders, kind

    @classmethod
    def make(cls, name: str, memory_bytes: int | None, pids: int = PIDS) -> tuple[Cgroup | None, str]:
        """A new cgroup for a worker, with its limits set; (None, why) where none can be had.
        The second item says what was done, for the report."""
        if not hasattr(os, "geteuid"):
            return None, "none: no cgroups on this system"
        own = _own()
        mounts = _mounts()
        why = "no cgroup file system is mounted"
        for point, fstype, _ in mounts:
            if fstype != "cgroup2" or "" not in own:
                continue
            folder = Path(point + own[""].rstrip("/")) / name
            sweep(folder.parent)
            try:
                folder.mkdir()
            except OSError as e:
                why = f"cgroup v2 at {point}: {e.strerror}"
                continue
            if (folder / "memory.max").exists() and (folder / "pids.max").exists():
                try:
                    if memory_bytes:
                        _write(folder / "memory.max", str(memory_bytes))
                        if (folder / "memory.swap.max").exists():
                            _write(folder / "memory.swap.max", "0")
                    _write(folder / "pids.max", str(pids))
                    return cls([folder], "cgroup v2"), "cgroup v2 (memory.max, pids.max)"
                except OSError as e:
                    why = f"cgroup v2 at {point}: {e.strerror}"
            else:
                why = f"cgroup v2 at {point} delegates no memory and pids controllers here"
            _remove(folder)
        v1 = {}
        for point, fstype, options in mounts:
            for controller in ("memory", "pids"):
                if fstype == "cgroup" and controller in options and controller in own:
                    v1[controller] = Path(point + own[controller].rstrip("/")) / name
        if set(v1) != {"memory", "pids"}:
            return None, f"none: {why}" + ("" if v1 else "; no cgroup v1 memory and pids hierarchies")
        made = []
        try:
            for folder in v1.values():
                sweep(folder.parent)
                folder.mkdir()
                made.append(folder)
            if memory_bytes:
                _write(v1["memory"] / "memory.limit_in_bytes", str(memory_bytes))
                if (v1["memory"] / "memory.memsw.limit_in_bytes").exists():
                    try:
                        _write(v1["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
                    except OSError:
                        pass  # swap accounting off: nothing to bound there
            _write(v1["pids"] / "pids.max", str(pids))
        except OSError as e:
            for folder in made:
                _remove(folder)
            return None, f"none: {why}; cgroup v1: {e.strerror}"
        return cls(made, "cgroup v1"), "cgroup v1 (memory.limit_in_bytes, pids.max)"

    def add(self, pid: int) -> None:
        """Move process ``pid`` (a host pid) in; OSError if it cannot be."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", str(pid))

    def members(self) -> list[int]:
        try:
            return [int(p) for p in (self.folders[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        """Kill what is left in it and remove it (its processes must be gone first)."""
        for _ in range(50):
            left = self.members()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            time.sleep(0.01)
        for folder in self.folders:
            _remove(folder)


PREFIX = "grader-worker-"


def sweep(parent: Path) -> None:
    """Remove the empty worker cgroups under ``parent`` that a grading which has ended left
    (one whose worker took longer to end than :meth:`Cgroup.remove` waited, or a grading that
    was killed). Those of a grading still running are its own to remove: left alone."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        owner = name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and (int(owner) == os.getpid() or not os.path.exists(f"/proc/{owner}")):
            try:
                (parent / name).rmdir()  # refused while a process is in it
            except OSError:
                pass


def _remove(folder: Path) -> None:
    for _ in range(20):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
