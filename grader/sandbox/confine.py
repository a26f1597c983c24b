"""What student code must not see, and hiding it.

The reference answers (``solutions/``, the ``attnmask`` package that every
chapter imports, the grader's own source), the other submissions of a class and
every file that holds the seed (results, logs, the class manifest) are hidden
from the worker: before it runs any student code, a worker started as root
enters a private mount namespace and mounts an empty read-only tmpfs over each
of those folders (an empty file over each file). This is PrairieLearn's "remove
the reference files before student code runs", done without touching the
instructor's checkout, whose permissions are whatever ``git clone`` gave it.

Only the standard library is imported here: the worker uses :func:`hide`.
Hand-written rather than bubblewrap (``bwrap``) because it must work where
``bwrap`` is not installed (Gradescope's and GitHub's images), and a mount
namespace is four system calls.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV = 2, 4
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def _package_dir(name: str) -> Path | None:
    """Where package ``name`` lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def course_root() -> Path | None:
    """The course checkout the grader runs from (it holds ``grader/`` and
    ``attnmask/`` side by side), or None when the grader is installed as a package."""
    here = Path(__file__).resolve().parents[2]
    if (here / "grader").is_dir() and (here / "attnmask").is_dir() and here.name not in (
            "site-packages", "dist-packages"):
        return here
    return None


#: The operating system: the top-level folders of ``/`` that stay in view. Every other
#: one (``/tmp``, ``/home``, ``/root``, ``/opt``, ``/srv``, ``/mnt``, a ``/work`` or
#: ``/autograder``...) is where people keep files: other copies of the course, other
#: gradings, reports. Each is covered, with what the worker needs bound back (see :func:`hide`).
SYSTEM = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "nix", "proc", "run",
                    "sbin", "snap", "sys", "usr", "var"})
#: Folders of every user inside the system's own.
SHARED_IN_SYSTEM = ("/var/tmp", "/dev/shm")


def others_folders(root: str = "/") -> list[str]:
    """Every top-level folder of ``root`` that is not the operating system's, and
    :data:`SHARED_IN_SYSTEM`: where other people's files can lie around."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    return [os.path.join(root, n) for n in names if n not in SYSTEM] + list(SHARED_IN_SYSTEM)


def private_paths(extra: Iterable[str | os.PathLike] = ()) -> list[str]:
    """The folders and files student code must not read: the course checkout (or,
    when installed, the ``grader`` and ``attnmask`` packages), ``extra`` (the
    submission, a class's submissions and output folder) and :func:`others_folders`."""
    paths = [course_root(), _package_dir("grader"), _package_dir("attnmask"), *map(Path, extra),
             *map(Path, others_folders())]
    out: list[str] = []
    for p in paths:
        if p is None:
            continue
        p = Path(os.path.abspath(p))
        if p.exists() and str(p) not in out and p != Path("/"):
            out.append(str(p))
    return out


def needed_paths() -> list[str]:
    """What the worker itself needs to keep seeing: Python, its libraries, torch, the
    shared libraries it may load (``LD_LIBRARY_PATH``, CUDA's or ROCm's home) and the
    worker's own folder (its working directory)."""
    keep = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__), os.getcwd(),
            os.path.dirname(os.path.realpath(sys.executable))}
    keep |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)}
    keep |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and os.path.isdir(p)}
    keep |= {os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH", "ROCM_PATH")
             if os.path.isdir(os.environ.get(v, ""))}
    torch_dir = _package_dir("torch")
    if torch_dir is not None:
        keep.add(str(torch_dir))
    return sorted(os.path.realpath(p) for p in keep)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class HideError(OSError):
    """The mount namespace could not be made (no CAP_SYS_ADMIN, e.g. in a default Docker container)."""


def hide(paths: Iterable[str], keep: Iterable[str] | None = None) -> int:
    """Enter a private mount namespace and cover each of ``paths`` with an empty
    tmpfs (an empty file over a file). A folder that holds something in ``keep``
    (default :func:`needed_paths`) gets the tmpfs too, with those entries bound
    back into it, so that nothing new appears there either (another grading's
    folder in /tmp, say). Returns how many mounts were made; raises
    :class:`HideError` when the namespace cannot be made. Call it before any
    student code runs."""
    keep = sorted({os.path.realpath(k) for k in (needed_paths() if keep is None else keep)})
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target: str, fstype, flags: int, data) -> None:
        if libc.mount(source, target.encode(), fstype, flags, data) != 0:
            err = ctypes.get_errno()
            raise HideError(err, f"mount {target}: {os.strerror(err)}")

    if libc.unshare(_CLONE_NEWNS) != 0:
        raise HideError(ctypes.get_errno(), f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    mount(b"none", "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing we mount leaks back out
    done = 0
    for path in sorted({os.path.realpath(p) for p in paths}, key=lambda p: p.count("/")):
        if any(_within(path, k) for k in keep) or os.path.islink(path) or not os.path.exists(path):
            continue  # inside something the worker needs, or nothing to cover
        if not os.path.isdir(path):
            mount(b"/dev/null", path, None, _MS_BIND, None)
            done += 1
            continue
        needed = sorted({k[len(path):].lstrip("/").split("/")[0] for k in keep if _within(k, path)})
        fds = {name: os.open(os.path.join(path, name), os.O_PATH) for name in needed}
        try:
            mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=16m,mode=1777")
            done += 1
            for name, fd in fds.items():
                target = os.path.join(path, name)
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                mount(f"/proc/self/fd/{fd}".encode(), target, None, _MS_BIND | _MS_REC, None)
                done += 1
        finally:
            for fd in fds.values():
                os.close(fd)
    return done
