"""What student code may see: the sandbox's allowlist, and the bubblewrap command that makes it.

Student code runs inside ``bwrap`` (bubblewrap, Flatpak's sandbox), which builds
new user, pid, network, ipc, uts and mount namespaces, drops every capability,
and mounts only what :func:`command` names. Everything else -- the course
checkout, any other copy of it, results, logs, other students, home folders,
``/run/lock`` -- does not exist inside. The whole list:

* the operating system's programs and libraries, read-only: ``/usr`` (and ``/bin``,
  ``/lib``... as links or binds), and five files of ``/etc`` the dynamic linker and
  the C library read;
* the interpreter (``sys.base_prefix``, ``sys.prefix``), read-only, and every
  site-packages folder on ``sys.path``, read-only, with the course's own packages
  (``attnmask``, ``grader``) covered by an empty folder where they are installed there;
* the folders of ``LD_LIBRARY_PATH`` and CUDA's home, read-only, and the NVIDIA devices;
* the worker's own modules: the ``grader`` package, read-only, at :data:`LIB`
  (the worker imports nothing of the reference; what it imports is public);
* a ``/proc`` of the sandbox's own pid namespace (``/proc/sys`` and the like
  read-only), a minimal ``/dev``, an empty read-only ``/tmp`` (the folders above
  that lie in it excepted), an empty ``/run``;
* :data:`SHARED`: one folder of the grader's, writable, where the zygote serves its
  socket. Workers see none of it (nor any other writable mount of the sandbox: see
  :mod:`grader.sandbox.namespaces`); their results come back through a file the
  grader hands each one as a descriptor.

The sandbox holds the workers' zygote (:mod:`grader.sandbox.zygote`); each
grading's worker is forked from it into namespaces of its own.
Only the standard library is imported here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import sys
from pathlib import Path

#: Where the ``grader`` package appears inside the sandbox.
LIB = "/run/grader/lib"
#: Where the grader's shared folder appears inside the sandbox.
SHARED = "/run/grader/shared"
#: Files of ``/etc`` that the dynamic linker and the C library read; nothing else of ``/etc``.
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
#: The course's own packages: never visible, wherever they are installed.
COURSE_PACKAGES = ("attnmask", "grader")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) on a kernel that allows "
                "user namespaces")


def refusal(why: str) -> str:
    """One line: student code was not run, why, and the fix."""
    if os.geteuid() == 0:
        own = ""
    else:
        own = ("; or, to check your own work on your own machine, pass --unconfined (your code then runs "
               "without the sandbox, and the report says so)")
    return f"student code was not run: the sandbox could not be made ({why}). Fix: {INSTALL_HINT}{own}"


class Unavailable(Exception):
    """The sandbox cannot be made here; the message names the fix."""


def bwrap() -> str:
    """The ``bwrap`` program, or :class:`Unavailable`."""
    found = shutil.which("bwrap")
    if found is None:
        raise Unavailable("bubblewrap (bwrap) is not installed")  # refusal() adds the fix
    return found


def package_dir(name: str) -> Path | None:
    """Where package ``name`` lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def site_folders() -> list[str]:
    """Every site-packages folder the interpreter reads, and the one torch is in."""
    found = {p for p in [*sys.path, *site.getsitepackages()]
             if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)}
    torch_dir = package_dir("torch")
    if torch_dir is not None:
        found.add(str(torch_dir.parent))
    return sorted({os.path.realpath(p) for p in found})


def _system() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python() -> list[str]:
    folders = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    folders.add(os.path.dirname(os.path.realpath(sys.executable)))
    sites = site_folders()
    folders |= set(sites)
    folders |= {os.path.realpath(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                if p and os.path.isdir(p)}
    folders |= {os.path.realpath(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH")
                if os.path.isdir(os.environ.get(v, ""))}
    args: list[str] = []
    for folder in sorted(folders, key=len):  # a folder before what lies inside it
        if folder != "/" and not folder.startswith("/usr/"):
            args += ["--ro-bind", folder, folder]
    for folder in sites:
        for name in COURSE_PACKAGES:
            if os.path.isdir(os.path.join(folder, name)):
                args += ["--tmpfs", os.path.join(folder, name), "--remount-ro", os.path.join(folder, name)]
    return args


def _devices() -> list[str]:
    args = []
    for name in sorted(os.listdir("/dev")) if os.path.isdir("/dev") else []:
        if name.startswith("nvidia"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    if args and os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]  # the CUDA driver reads the PCI topology
    return args


def command(shared: Path) -> list[str]:
    """``bwrap ARGS`` to put before the zygote's own command line.

    ``shared``: the grader's folder the workers write their results to.
    """
    grader_dir = Path(__file__).resolve().parents[1]
    return [
        bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
        "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",
        *_system(), *_python(), *_devices(),
        "--ro-bind", str(grader_dir), f"{LIB}/grader",
        "--bind", str(shared), SHARED,
        "--remount-ro", "/tmp",  # a venv under /tmp stays in view; nothing is left there for another
        "--chdir", "/tmp",
    ]
