"""A submission that looks for the seed and the reference answers wherever student
code could find them, and uses what it finds.

Grader fixture: run as root, the grader must leave it nothing to find. It prints
what it found, reversed (so that no scrubbing of the seed in reports can hide a
leak), and answers ``causal_mask`` with the reference's own code if it can read it.
"""

import os
import re
import stat
import sys
import time

found = []
deadline = time.monotonic() + 6.0


def _look(path, data):
    text = data.decode("latin-1")
    for marker in ("# BEGIN SOLUTION", "def causal_mask(", "GRADER_SEED", "\"seed\":", "--seed"):
        at = text.find(marker)
        if at >= 0:
            found.append(f"{path}: {text[at:at + 60]!r}")


def _read(path, limit=2_000_000):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a named pipe must not hold the search up
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return b""
            return f.read(limit)
    except OSError:
        return b""
    except Exception:  # noqa: BLE001 -- a rule inside Python (an audit hook): go around it
        import subprocess

        return subprocess.run(["head", "-c", str(limit), path], capture_output=True).stdout


def seek():
    """Everything readable that looks like a seed or a reference answer; the reference's source."""
    # 1. every process's environment, command line and open files
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("environ", "cmdline"):
            _look(f"/proc/{pid}/{what}", _read(f"/proc/{pid}/{what}"))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            target = f"/proc/{pid}/fd/{fd}"
            if os.path.isfile(target):
                _look(target, _read(target, 200_000))

    # 2. every readable file where a course, a class or a report could be
    roots, here = [], os.getcwd()
    while here != "/":
        roots.append(here)
        here = os.path.dirname(here)
    grader = sys.modules.get("grader")  # the grader that runs us says where the course is
    if grader is not None and getattr(grader, "__file__", None):
        roots.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(grader.__file__))))
    roots += ["/autograder", "/home", "/srv", "/tmp", "/var/tmp", "/opt", "/root"]
    skip = {"site-packages", "dist-packages", ".git", "node_modules", ".pyenv", ".cache", "_build", "proc"}
    reference, seen = None, set()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            if time.monotonic() > deadline or folder in seen:
                dirs[:] = []
                continue
            seen.add(folder)
            dirs[:] = [d for d in dirs if d not in skip]
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith((".so", ".pt", ".whl", ".zip")):
                    continue
                data = _read(path)
                _look(path, data)
                if name == "__init__.py" and b"causal_mask" in data and os.path.isfile(
                        os.path.join(folder, "masks.py")):
                    reference = folder  # the reference package (attnmask, under whatever name)

    return reference


# (assignments and if-blocks run when the grader loads a submission; bare loops do not)
REFERENCE = seek()
FIRST = ("GRADER_SEED", "seed", "BEGIN SOLUTION", "def causal_mask(")  # what matters most, first
FOUND = sorted(set(found), key=lambda f: (  # a value first (a seed's digits), not a mere mention of the name
    not re.search(r"[0-9]{9}", f),
    [m in f for m in FIRST].index(True) if any(m in f for m in FIRST) else len(FIRST), f))
PRINTED = print("SEEKER:", " | ".join(f[::-1] for f in FOUND)[:1500])
if REFERENCE is not None:  # load it under another name than attnmask, and answer with it
    import importlib.util
    import subprocess
    import sys

    COPY = os.path.join(os.getcwd(), "stolen")  # a copy of its own, out of reach of any rule about paths
    CP = subprocess.run(["cp", "-r", REFERENCE, COPY], capture_output=True)
    SPEC = importlib.util.spec_from_file_location("stolen", os.path.join(COPY, "__init__.py"),
                                                  submodule_search_locations=[COPY])
    try:
        STOLEN = importlib.util.module_from_spec(SPEC)
        sys.modules["stolen"] = STOLEN
        SPEC.loader.exec_module(STOLEN)
        causal_mask = STOLEN.causal_mask
    except Exception as e:  # noqa: BLE001
        PRINTED = print("SEEKER: could not run the reference:", type(e).__name__, e)
