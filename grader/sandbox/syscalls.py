"""The system calls a worker may not make, refused by the kernel (seccomp), and its own keyring.

Namespaces give a worker its own files, processes and network, but two things of the
kernel's are not namespaced, and every worker of a class run would share them:

* **the keyrings.** Keys belong to a user of the whole machine: a worker's uid maps back
  to the grader's, so ``/proc/keys`` lists the grader's keys to it and every keyring the
  grader may write (its user keyring, ``KEY_USR_ALL``) takes a key that the next student
  finds and reads. A worker gets a new, empty session keyring (:func:`own_keyring`: the
  grader's is no longer its own), then may make no keyring call at all (``add_key``,
  ``request_key``, ``keyctl`` fail with EPERM), as in Docker's default profile.
* **space a file keeps without growing.** ``RLIMIT_FSIZE`` bounds the size of every file
  a worker writes (its output, its results), but ``fallocate`` with ``KEEP_SIZE``
  reserves disk blocks past a file's end without changing its size, past that limit, on
  the disk all gradings share. ``fallocate`` fails with EOPNOTSUPP (C libraries then
  write the bytes, which the limit bounds), and so does io_uring, whose requests no
  seccomp filter sees (ENOSYS: libraries fall back to plain calls).

The filter (:func:`forbid`) also refuses every call made through another architecture's
entry point (32-bit ``int 0x80``, x32), whose numbers differ. Only the standard library
is imported here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

#: Per machine: (AUDIT_ARCH_*, {name: number}) of the calls refused.
_ARCH = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "fallocate": 285}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "fallocate": 47}),
}
_IO_URING = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}  # one number everywhere
#: What each refused call answers.
REFUSED = {"add_key": errno.EPERM, "request_key": errno.EPERM, "keyctl": errno.EPERM,
           "fallocate": errno.EOPNOTSUPP, **{name: errno.ENOSYS for name in _IO_URING}}
_X32 = 0x40000000  # x86-64's x32 calls: the number with this bit set
_KEYCTL_JOIN_SESSION_KEYRING = 1
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_LD_ABS_W, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO

_libc = ctypes.CDLL(None, use_errno=True)


class Unsupported(OSError):
    """This machine's kernel or architecture cannot give a worker these limits."""


def _numbers() -> tuple[int, dict[str, int]]:
    machine = os.uname().machine
    if machine not in _ARCH:
        raise Unsupported(errno.ENOSYS, f"no system call table for {machine}")
    arch, calls = _ARCH[machine]
    return arch, {**calls, **_IO_URING}


def own_keyring() -> None:
    """Join a new, anonymous, empty session keyring (the grader's stops being this process's).
    A kernel built without keys has no keyrings to share: nothing to do there."""
    keyctl = _numbers()[1]["keyctl"]
    if _libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise Unsupported(err, f"a session keyring of its own: {os.strerror(err)}")


def _filter() -> bytes:
    """The BPF program: foreign entry points refused, each of :data:`REFUSED` answered, the rest allowed."""
    arch, numbers = _numbers()

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    prog = [op(_LD_ABS_W, 4), op(_JEQ, arch, jt=1), op(_RET, _ERRNO | errno.ENOSYS), op(_LD_ABS_W, 0)]
    if arch == _ARCH["x86_64"][0]:
        prog += [op(_JGE, _X32, jf=1), op(_RET, _ERRNO | errno.ENOSYS)]
    for name, number in numbers.items():
        prog += [op(_JEQ, number, jf=1), op(_RET, _ERRNO | REFUSED[name])]
    return b"".join(prog) + op(_RET, _ALLOW)


def forbid() -> None:
    """Install the filter for this process and all it starts, for good (it needs no_new_privs,
    or a capability: call it last)."""
    code = _filter()
    buffer = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(code) // 8, ctypes.addressof(buffer))
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise Unsupported(err, f"seccomp filter: {os.strerror(err)}")
