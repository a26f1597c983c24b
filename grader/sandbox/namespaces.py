"""One grading's namespaces, made inside the zygote's sandbox, and what the worker measures of them.

The zygote runs inside bubblewrap (:mod:`grader.sandbox.allowlist`) with torch
imported; every worker is forked from it. Forked processes would share the
zygote's writable places (its root, ``/dev``, ``/tmp``, ``/dev/shm``), SysV memory,
abstract sockets, processes and the grader's keyrings, so before any student code
runs a worker (:func:`isolate`)

1. unshares new user, mount, pid, ipc and network namespaces (the kernel gives it
   every capability in the new user namespace, over those namespaces only);
2. forks: its child is process 1 of the new pid namespace, and when it ends the
   kernel kills everything left in that namespace, whatever it forked; where the kernel
   keeps ``pid_max`` per namespace (6.14 on), it holds at most 300 processes
   (:func:`_bound_processes`);
3. makes every mount it inherited read-only for itself (the sandbox's root and
   ``/dev`` among them: what one student wrote there the next would find), then
   mounts one tmpfs of its own, bounded (:data:`TMPFS`: bytes and files), over
   ``/run``: its working folder and home (:data:`WORK`, :data:`HOME`), and the folders
   bound over ``/tmp`` (unless Python lives there: /tmp then stays the sandbox's,
   read-only) and ``/dev/shm``. Its results go to a file the parent hands over as
   a descriptor: no folder of the grader's is writable to it. ``/proc`` becomes one of
   its own (:func:`_own_proc`): itself and a few system files, read-only;
4. covers ``/dev/pts`` with an empty read-only folder (no pseudo-terminal: the sandbox's
   are every worker's), joins a session keyring of its own, drops every capability, for
   good (bounding set, then capset), with no new privileges, and installs the seccomp
   allowlist of :mod:`grader.sandbox.syscalls` (no user namespace, no mount, no keyring,
   no ``memfd_create``, ``userfaultfd``, ``perf_event_open``, ``flock`` or record locks):
   it runs as uid 65534 and cannot undo a mount.

When the worker ends, its namespaces end, and all it wrote with them.
It sees no other process: the sandbox's ``/proc`` listed the zygote and every
worker of the class alive, and any of them could read another's command line,
name and signal mask (a channel between two students graded together).

:func:`measure` is what the worker then reports on its "ready" line, from inside.
Only the standard library is imported here.
"""

from __future__ import annotations

import ctypes
import os
import signal

from . import syscalls

#: Where a worker finds its working folder and its home, and the folders bound over /tmp and /dev/shm.
WORK, HOME, TMP, SHM = "/run/work", "/run/home", "/run/tmp", "/run/shm"
#: The worker's one writable tmpfs: all it may write, together (its memory is not counted in RSS).
TMPFS = "size=256m,nr_inodes=16384,mode=0755"
#: Mounts left writable: the kernel's own views (the worker's writes there are its own process's).
KERNEL_FILESYSTEMS = ("proc", "devpts", "mqueue", "sysfs", "cgroup", "cgroup2")
#: The least ``pid_max`` the kernel takes: a worker's pid namespace holds at most 300 processes
#: (a cgroup's ``pids.max``, where there is one, bounds them lower: :data:`grader.sandbox.cgroups.PIDS`).
PID_MAX = 301
PID_MAX_KERNEL = (6, 14)
#: The system files of a worker's own /proc (:func:`_own_proc`): what Python, torch and the
#: grader read there. Not the keys, the page frames (``kpage*``), ``kcore``, ``kmsg``, ``sysrq-trigger``.
PROC_FILES = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems", "sys",
              "cgroups", "swaps")
UID = 65534
_NEWNS, _NEWUSER, _NEWPID, _NEWNET, _NEWIPC = 0x20000, 0x10000000, 0x20000000, 0x40000000, 0x08000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 4096, 8192, 16384, 1 << 18
#: Mount options as /proc/self/mountinfo writes them, and their flags: a remount must keep those the
#: kernel locked when the namespace was made (nosuid, nodev, noexec, the atime ones).
_OPTION_FLAGS = {"ro": _MS_RDONLY, "nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": 8, "noatime": 1024,
                 "nodiratime": 2048, "relatime": 1 << 21, "strictatime": 1 << 24}
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 24, 38, 1

_libc = ctypes.CDLL(None, use_errno=True)


class Refused(OSError):
    """A namespace, mount or capability change the kernel refused."""


def _call(what: str, result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise Refused(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    source_b, fstype_b, data_b = (None if v is None else v.encode() for v in (source, fstype, data))
    _call(f"mount {target}", _libc.mount(source_b, target.encode(), fstype_b, flags, data_b))


def drop_capabilities() -> None:
    """Every capability, for good: the bounding set, then effective, permitted and inheritable."""
    for cap in range(64):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: nothing to drop
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    _call("capset", _libc.capset(header, (ctypes.c_uint32 * 6)()))
    _call("no_new_privs", _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))


def _unescape(field: str) -> str:
    """A path as mountinfo writes it (space, tab, newline and backslash as octal escapes)."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _read_only_inherited() -> None:
    """Remount read-only every writable mount this namespace inherited (folders only: a device
    node bound in stays writable, as a device on a read-only mount is)."""
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        options = fields[5].split(",")
        fstype = fields[fields.index("-") + 1]
        target = _unescape(fields[4])
        if "rw" not in options or fstype in KERNEL_FILESYSTEMS or not os.path.isdir(target):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for option in options:
            flags |= _OPTION_FLAGS.get(option, 0)
        _mount(None, target, None, flags)


def isolate() -> None:
    """Move this process into namespaces of its own (see the module's docstring), as process 1
    of a new pid namespace. Returns in process 1; the process that called it waits for that one
    and exits as it does. Raises an OSError (:class:`Refused`, :class:`grader.sandbox.syscalls.Unsupported`)
    where the kernel refuses a step: before any student code could run."""
    uid, gid = os.getuid(), os.getgid()
    _call("unshare", _libc.unshare(_NEWUSER | _NEWNS | _NEWPID | _NEWNET | _NEWIPC))
    for name, text in (("setgroups", "deny"), ("uid_map", f"{UID} {uid} 1"), ("gid_map", f"{UID} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    pid = os.fork()
    if pid:
        _relay(pid)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the minder kills the process above
    os.setsid()  # a session of its own, inside its pid namespace
    _bound_processes()
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _read_only_inherited()
    _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV, TMPFS)  # the rest of /run: gone
    for folder, mode in ((WORK, 0o700), (HOME, 0o700), (TMP, 0o1777), (SHM, 0o1777)):
        os.mkdir(folder)
        os.chmod(folder, mode)  # past the umask
    if not os.listdir("/tmp"):
        _mount(TMP, "/tmp", None, _MS_BIND)
    if os.path.isdir("/dev/shm"):
        _mount(SHM, "/dev/shm", None, _MS_BIND)
    _own_proc()
    _no_terminals()
    os.chdir(WORK)
    syscalls.own_keyring()
    drop_capabilities()
    syscalls.forbid()


def per_namespace_pid_max() -> bool:
    """Whether this kernel keeps ``pid_max`` per pid namespace (Linux 6.14 and later). Before,
    the file was the machine's: it is never written there."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= PID_MAX_KERNEL


def _bound_processes() -> None:
    """At most :data:`PID_MAX` - 1 processes and threads in this pid namespace, whatever the uid:
    ``RLIMIT_NPROC`` does not bind root, and a cgroup's ``pids.max`` is not on every machine.
    Only where ``pid_max`` is the namespace's own (:func:`per_namespace_pid_max`); refused
    (a user who is not root, a kernel that says no) it is left as it was."""
    if not per_namespace_pid_max():
        return
    try:
        with open("/proc/sys/kernel/pid_max", "w") as f:
            f.write(str(PID_MAX))
    except OSError:
        pass


def _own_proc() -> None:
    """A ``/proc`` that shows this worker alone: the sandbox's lists every process of bubblewrap's
    pid namespace (the zygote, and every worker of the class alive now, whose command line, name
    and signal mask anyone may read), and a fresh proc cannot be mounted over it (bubblewrap's
    covers of ``/proc/irq`` and ``/proc/bus`` are locked in place). So a read-only tmpfs takes
    its place, holding, each bound read-only: ``self`` (this process's own folder; its children
    see it too), the system files of :data:`PROC_FILES`, and the links ``thread-self``, ``mounts``
    and ``net`` into ``self``. No other process's folder is there, no ``/proc/sys`` entry can be
    written (a worker of root is uid 0 to the kernel's file checks: ``core_pattern`` was writable),
    and nothing of the page frames (``kpageflags``) or the keys is in view."""
    own = os.readlink("/proc/self")  # this process's number in the sandbox's pid namespace
    staging = "/run/proc"
    os.mkdir(staging)
    _mount("tmpfs", staging, "tmpfs", _MS_NOSUID | _MS_NODEV | 8, "size=4k,nr_inodes=64,mode=0555")
    entries = [("self", f"/proc/{own}")]
    entries += [(name, f"/proc/{name}") for name in PROC_FILES if os.path.exists(f"/proc/{name}")]
    for name, source in entries:
        target = f"{staging}/{name}"
        if os.path.isdir(source):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(source, target, None, _MS_BIND | _MS_REC)
        _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | 8)
    for name, to in (("thread-self", "self"), ("mounts", "self/mounts"), ("net", "self/net")):
        os.symlink(to, f"{staging}/{name}")
    _mount(None, staging, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | 8)
    _mount(staging, "/proc", None, _MS_MOVE)


def _no_terminals() -> None:
    """No pseudo-terminal: the sandbox's ``/dev/pts`` is every worker's (one leaves a line in a
    pty, another reads it), so each worker gets an empty read-only one, and ``/dev/ptmx`` (a link
    into it, or a device) leads nowhere."""
    if os.path.isdir("/dev/pts"):
        flags = _MS_NOSUID | _MS_NODEV | _MS_RDONLY
        _mount("tmpfs", "/dev/pts", "tmpfs", flags, "size=4k,nr_inodes=2,mode=0555")
    if os.path.exists("/dev/ptmx") and not os.path.islink("/dev/ptmx"):
        _mount("/dev/null", "/dev/ptmx", None, _MS_BIND)


def _relay(pid: int) -> None:
    """In the process that called :func:`isolate`: wait for process 1 and end as it did."""
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


def _read_first(path: str) -> str:
    """The first word of a small file, or "?"."""
    try:
        with open(path) as f:
            return (f.read(40).split() or ["?"])[0]
    except OSError:
        return "?"


def _status_field(name: str) -> str:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split()[1]
    except OSError:
        pass
    return "?"


def _shows(path: str) -> bool:
    """Whether ``path`` shows anything here: a file, or a folder with something in it (an
    installed course package is covered by an empty folder, which shows nothing)."""
    try:
        return not os.path.isdir(path) or bool(os.listdir(path)) if os.path.lexists(path) else False
    except OSError:
        return True


def measure(secrets: list[str]) -> dict[str, str]:
    """What holds in this process, seen from inside: its uid, its capabilities, whether it
    is process 1 of its pid namespace, its network interfaces, and how many of ``secrets``
    (the course's content, the submission, the results) it can see, with the index of the
    first it sees (``first``, only then). Values are short words or numbers."""
    try:
        with open("/proc/net/dev") as f:
            interfaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    except OSError:
        interfaces = ["?"]
    cap_eff, cap_bnd = _status_field("CapEff"), _status_field("CapBnd")
    seen = [i for i, p in enumerate(secrets) if _shows(p)]
    return {
        "uid": str(os.getuid()),
        "caps": "none" if cap_eff.strip("0") == "" and cap_bnd.strip("0") == "" else "some",
        "pid": str(os.getpid()),
        "net": "lo" if interfaces == ["lo"] else str(len(interfaces)),
        "seen": str(len(seen)),
        "pidmax": _read_first("/proc/sys/kernel/pid_max"),
        **({"first": str(seen[0])} if seen else {}),
    }


def holds(measured: dict[str, str], secrets: list[str] | None = None) -> str | None:
    """None if ``measured`` shows a confined worker; else what did not hold, in words, naming
    the first path of ``secrets`` (what :func:`measure` was given) the worker could see."""
    wrong = []
    if measured.get("uid") in (None, "0"):
        wrong.append(f"it runs as uid {measured.get('uid', '?')}")
    if measured.get("caps") != "none":
        wrong.append("it kept capabilities")
    if measured.get("pid") != "1":
        wrong.append("it is not alone in its pid namespace")
    if measured.get("net") != "lo":
        wrong.append("it has a network")
    if measured.get("seen") != "0":
        first = measured.get("first", "")
        named = secrets[int(first)] if secrets and first.isdigit() and int(first) < len(secrets) else None
        wrong.append(f"it sees {measured.get('seen', '?')} of the course's or the grading's own paths"
                     + (f", {named} first" if named else ""))
    return "; ".join(wrong) or None


def isolation(confined: bool, measured: dict[str, str], secrets: list[str] | None = None
              ) -> dict[str, object]:
    """The report's isolation block: what kept the seed and the references from student code,
    as the worker measured it from inside (``measured``: see :func:`measure`, of ``secrets``)."""
    if not confined:
        return {"sandbox": "none", "seed_protected": False, "references_protected": False,
                "why": "run with --unconfined: student code ran as the grader's own user, without the "
                       "sandbox; it could read the seed and the reference answers"}
    if not measured:
        return {"sandbox": "bubblewrap", "seed_protected": True, "references_protected": True,
                "why": "no student code ran"}
    broken = holds(measured, secrets)
    return {"sandbox": "bubblewrap", "seed_protected": broken is None, "references_protected": broken is None,
            "measured": dict(measured), "why": broken or ""}
