"""The system calls a worker may make: a default-deny allowlist, enforced by the kernel (seccomp).

Namespaces give a worker its own files, processes and network, but the kernel's own attack
surface is the whole machine's: ``userfaultfd``, ``perf_event_open``, a user namespace of its
own (and in it a tmpfs of any size: memory no limit counts), ``memfd_create`` (memory that
neither the address-space limit nor the parent's RSS watch counts), keyrings, ``flock`` on a
file every worker sees (a channel between two students graded at once). Rather than list what
attacks used, the filter lists what grading needs, and the kernel refuses the rest.

:data:`ALLOWED` was measured: ``strace -f -c`` of ``python -m grader`` on
``tests/submissions/correct.py``, ``mistakes.py`` and ``hostile.py`` (the grader, bwrap, the
zygote and the workers: every call torch, the checks and Python made), less what only bwrap and
the zygote's setup need (``mount``, ``pivot_root``, ``unshare``, ``keyctl``), plus the members
of the same families that the C library or Python pick on another path or machine (``readv``
beside ``read``, ``statx`` beside ``newfstatat``, ``exit_group``, the ``timer*`` calls, ...),
and System V and POSIX IPC (the worker's IPC namespace is its own). Everything else fails with
ENOSYS, as on a kernel without it (C libraries then fall back: glibc's threads from ``clone3``
to ``clone``), except the calls of :data:`ERRORS`, which answer as before this filter (keyrings
EPERM, ``fallocate`` EOPNOTSUPP, file handles EPERM). Three allowed calls are allowed only in
part: ``clone`` without any namespace flag (a thread or a process, never a user namespace),
``fcntl`` without locks or leases (:data:`FCNTL`), and ``preadv2``/``pwritev2`` without
:data:`RWF_NOWAIT` (EOPNOTSUPP). What tells which pages of a file are in the page cache without
timing -- ``mincore``, ``cachestat``, ``RWF_NOWAIT`` -- is refused: the page cache is the
machine's, and a student graded later would read what pages an earlier one touched.
A call from another architecture's entry point (32-bit ``int 0x80``, x32), whose numbers
differ, fails with ENOSYS too.

The filter is built with libseccomp (``pyseccomp``, which wraps the system's libseccomp2)
rather than by hand: it knows every architecture's numbers and compiles the argument tests.

A worker also gets a new, empty session keyring (:func:`own_keyring`: the grader's is no
longer its own) before the filter forbids every keyring call.
"""

from __future__ import annotations

import ctypes
import errno
import os

#: What grading calls (measured: see the module's docstring), and its families.
MEASURED = frozenset("""
accept4 access arch_prctl bind brk capget capset chdir chmod clock_nanosleep clone close close_range
connect creat dup2 epoll_create1 eventfd2 execve fchdir fcntl fstat futex getcwd getdents64 geteuid
getgid getpid getrandom getsockname gettid getuid ioctl kill listen lseek madvise mbind mkdir mmap
mprotect mremap munmap newfstatat open openat pipe2 poll prctl pread64 prlimit64 pselect6 read
readlink recvfrom recvmsg rmdir rseq rt_sigaction rt_sigprocmask rt_sigreturn sched_getaffinity
sched_setaffinity sendmsg sendto set_robust_list set_tid_address setitimer setsid shutdown sigaltstack
signalfd4 socket stat symlink sysinfo tgkill umask uname unlink unlinkat vfork wait4 write
""".split())
FAMILIES = frozenset("""
exit exit_group restart_syscall getppid getpgrp getpgid getsid getresuid getresgid getegid getgroups
getrlimit setrlimit getrusage times gettimeofday clock_gettime clock_getres time nanosleep sched_yield
sched_getparam sched_getscheduler sched_get_priority_max sched_get_priority_min getpriority getcpu
readv writev pwrite64 preadv pwritev preadv2 pwritev2 dup dup3 pipe ppoll select epoll_create epoll_ctl
epoll_wait epoll_pwait epoll_pwait2 eventfd fstatfs statfs statx lstat readlinkat faccessat faccessat2
mkdirat renameat renameat2 rename link linkat symlinkat fsync fdatasync ftruncate truncate msync
membarrier get_mempolicy set_mempolicy getsockopt setsockopt getpeername socketpair recvmmsg
sendmmsg accept rt_sigsuspend rt_sigtimedwait rt_sigpending pause tkill waitid fchmod fchmodat
utimensat utime utimes futimesat getdents timer_create timer_settime timer_gettime timer_getoverrun
timer_delete timerfd_create timerfd_settime timerfd_gettime getitimer alarm copy_file_range sendfile
execveat get_robust_list openat2
shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl mq_open mq_unlink
mq_timedsend mq_timedreceive mq_getsetattr
""".split())
ALLOWED = MEASURED | FAMILIES
#: Calls refused with an answer of their own, not ENOSYS.
ERRORS = {"add_key": errno.EPERM, "request_key": errno.EPERM, "keyctl": errno.EPERM,
          "fallocate": errno.EOPNOTSUPP, "name_to_handle_at": errno.EPERM, "open_by_handle_at": errno.EPERM}
#: Never allowed, whatever is measured later: a test checks none is in ALLOWED.
NEVER = frozenset("""
userfaultfd perf_event_open unshare setns mount umount2 pivot_root move_mount open_tree fsopen fsmount
fsconfig fspick mount_setattr keyctl add_key request_key bpf ptrace process_vm_readv process_vm_writev
kexec_load kexec_file_load init_module finit_module delete_module memfd_create memfd_secret flock
inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark name_to_handle_at
open_by_handle_at io_uring_setup io_uring_enter io_uring_register clone3 personality acct swapon swapoff
reboot settimeofday clock_settime adjtimex clock_adjtime syslog quotactl chroot iopl ioperm
modify_ldt uselib pidfd_getfd pidfd_open process_madvise mknod mknodat fallocate
mincore cachestat readahead fadvise64
""".split())
#: ``clone`` flags that make namespaces: a clone with any of them is refused (EPERM).
CLONE_NAMESPACES = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                    | 0x40000000)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
#: ``fcntl`` commands allowed: no record locks (F_SETLK...), open-file locks or leases, which two
#: workers could take on a file both see.
FCNTL = {"F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_SETOWN": 8,
         "F_GETOWN": 9, "F_SETSIG": 10, "F_GETSIG": 11, "F_SETOWN_EX": 15, "F_GETOWN_EX": 16,
         "F_DUPFD_CLOEXEC": 1030, "F_SETPIPE_SZ": 1031, "F_GETPIPE_SZ": 1032, "F_ADD_SEALS": 1033,
         "F_GET_SEALS": 1034}
#: The flag of ``preadv2``/``pwritev2`` that answers EAGAIN where a page is not cached: the page
#: cache's state, read without timing (one student's reads seen by the next).
RWF_NOWAIT = 0x8
_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_JOIN_SESSION_KEYRING = 1

_libc = ctypes.CDLL(None, use_errno=True)


class Unsupported(OSError):
    """This machine's kernel, architecture or libraries cannot give a worker these limits."""


def own_keyring() -> None:
    """Join a new, anonymous, empty session keyring (the grader's stops being this process's).
    A kernel built without keys has no keyrings to share: nothing to do there."""
    keyctl = _KEYCTL.get(os.uname().machine)
    if keyctl is None:
        raise Unsupported(errno.ENOSYS, f"no system call table for {os.uname().machine}")
    if _libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise Unsupported(err, f"a session keyring of its own: {os.strerror(err)}")


def _library():
    try:
        import pyseccomp
    except (ImportError, OSError) as e:  # OSError: the module loads libseccomp.so.2 when imported
        raise Unsupported(errno.ENOSYS, f"libseccomp is not available ({e}): pip install pyseccomp, "
                                        "with the system's libseccomp2 (Debian/Ubuntu: apt-get install "
                                        "libseccomp2)") from None
    return pyseccomp


def build():
    """The filter (a ``pyseccomp.SyscallFilter``), not yet loaded."""
    sc = _library()
    f = sc.SyscallFilter(sc.ERRNO(errno.ENOSYS))
    f.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.ENOSYS))
    for name in sorted(ALLOWED - {"clone", "fcntl", "preadv2", "pwritev2"}):
        try:
            f.add_rule(sc.ALLOW, name)
        except (OSError, ValueError, RuntimeError):
            pass  # not a call of this architecture (open, stat... on aarch64)
    for name, err in ERRORS.items():
        f.add_rule(sc.ERRNO(err), name)
    f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACES, 0))
    for name in ("preadv2", "pwritev2"):  # flags are argument 5 (the offset takes two)
        f.add_rule(sc.ALLOW, name, sc.Arg(5, sc.MASKED_EQ, RWF_NOWAIT, 0))
        f.add_rule(sc.ERRNO(errno.EOPNOTSUPP), name, sc.Arg(5, sc.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
    for cmd in FCNTL.values():
        f.add_rule(sc.ALLOW, "fcntl", sc.Arg(1, sc.EQ, cmd))
    return f


_built: list = []  # the filter, or why it could not be built: once per zygote (prepare)


def prepare() -> None:
    """Build the filter once, in the zygote, for every worker forked from it to load."""
    if not _built:
        try:
            _built.append(build())
        except Exception as e:  # noqa: BLE001 -- libseccomp's errors come as several types
            why = e if isinstance(e, Unsupported) else Unsupported(errno.EINVAL, f"seccomp filter: {e}")
            _built.append(why)


def forbid() -> None:
    """Install the filter for this process and all it starts, for good (it needs no_new_privs,
    or a capability: call it last). :class:`Unsupported` where it cannot be built or loaded:
    the worker then runs no student code."""
    prepare()
    if isinstance(_built[0], Exception):
        raise _built[0]
    try:
        _built[0].load()
    except Exception as e:  # noqa: BLE001
        raise Unsupported(errno.EINVAL, f"seccomp filter: {e}") from None
