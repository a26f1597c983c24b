"""The grader's own files: snapshot them before student code runs, verify after, restore.

The second of two layers that keep a submission from changing anyone's grade
by editing files (the first: the worker runs as an unprivileged user, see
:mod:`grader.sandbox`). A :class:`Guard` holds the bytes of every file of the
``grader`` and ``attnmask`` packages and of the start-up hooks of every
interpreter that will run later -- ``*.pth``, ``sitecustomize`` /
``usercustomize`` and setuptools' ``__editable__`` finders in the site
directories and on ``sys.path`` -- about 50 small files, a few milliseconds.

:meth:`Guard.verify` compares what is on disk with the snapshot and puts back
what the worker could have changed: rewritten bytes, deleted files recreated,
files added inside the packages or added start-up hooks removed. A change the
worker could *not* have made (its user had no write permission there: someone
edited the grader during grading) is left alone and reported apart. Bytecode
caches (``__pycache__``) are deleted when changed, without blaming anyone:
grader processes grading other students write them too.

What this layer cannot do on its own (when the worker runs as the grader's own
user): protect the rest of site-packages (torch's own files), or restore files
if the submission kills the grading process before it gets to verify.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("grader", "attnmask")
#: Names in a site directory or on sys.path that run code when any interpreter starts.
_HOOK_STEMS = ("sitecustomize", "usercustomize")


@dataclass(frozen=True)
class Change:
    path: str  # as shown to people: "grader/checks/judges.py", "site-packages/x.pth"
    what: str  # "changed", "added" or "removed"
    cache: bool = False  # a bytecode cache: removed when changed, never blamed

    def __str__(self) -> str:
        return f"{self.path} {self.what}"


def _is_hook(name: str) -> bool:
    return (name.endswith(".pth") or name.split(".", 1)[0] in _HOOK_STEMS
            or name.startswith("__editable__"))


def _is_cache(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def writable_by(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether a process with exactly ``uid``/``gid`` (no other groups, no capabilities) may write."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def _key(st: os.stat_result | None) -> tuple | None:
    """What changes whenever a file's bytes or a folder's entries change: ctime cannot be set back."""
    if st is None:
        return None
    return st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


class Guard:
    """A snapshot of the grader's files and the interpreter's start-up hooks."""

    def __init__(self, trees: list[Path], hook_dirs: list[Path]):
        self.trees = list(dict.fromkeys(Path(t).resolve() for t in trees))
        hook_dirs = dict.fromkeys(Path(d).resolve() for d in hook_dirs)
        self.hook_dirs = [d for d in hook_dirs if d not in self.trees]
        self.files: dict[Path, tuple[bytes, os.stat_result]] = {}
        self.folders: dict[Path, tuple | None] = {}  # watched folders (trees', hook folders) -> _key
        self.hooks: set[Path] = set()  # start-up hooks that are folders (a sitecustomize package)
        self.dirs: dict[Path, os.stat_result] = {}  # for who could write: folders and nearest ancestors
        for tree in self.trees:
            for top, dirnames, filenames in os.walk(tree):
                self._watch(Path(top))
                for name in filenames:
                    self._take_file(Path(top) / name)
                dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(top, d))]
        for d in self.hook_dirs:
            self._watch(d)
            for name in self._entries(d):
                if _is_hook(name):
                    if os.path.isdir(d / name) and not os.path.islink(d / name):
                        self.hooks.add(d / name)
                    else:
                        self._take_file(d / name)

    @classmethod
    def for_grader(cls) -> Guard:
        """The ``grader`` and ``attnmask`` packages, the site directories and sys.path."""
        trees = []
        for name in PACKAGES:
            spec = importlib.util.find_spec(name)
            for location in (spec.submodule_search_locations or []) if spec else []:
                trees.append(Path(location))
        hook_dirs = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
        return cls(trees, [Path(d) for d in hook_dirs if d])

    # ------------------------------------------------------------------ snapshot

    def _take_file(self, path: Path) -> None:
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    self.files[path] = (f.read(), st)
        except OSError:
            pass

    def _watch(self, d: Path) -> None:
        st = _lstat(d)
        self.folders[d] = _key(st) if st is not None and stat.S_ISDIR(st.st_mode) else None
        while True:  # d's stat, or that of its nearest existing ancestor (to judge who could create it)
            try:
                self.dirs.setdefault(d, os.stat(d))
                return
            except OSError:
                if d.parent == d:
                    return
                d = d.parent

    @staticmethod
    def _entries(d: Path) -> list[str]:
        try:
            return sorted(os.listdir(d))
        except OSError:
            return []

    # ------------------------------------------------------------------ verify

    def _show(self, path: Path) -> str:
        for tree in self.trees:
            if path.is_relative_to(tree):
                return path.relative_to(tree.parent).as_posix()
        return f"{path.parent.name}/{path.name}"

    def _dir_stat(self, d: Path) -> os.stat_result | None:
        while d not in self.dirs and d.parent != d:
            d = d.parent
        return self.dirs.get(d)

    def _could(self, path: Path, writer: tuple[int, int] | None, *, content: bool) -> bool:
        """Could a process running as ``writer`` (None: as the grader) have made this change?"""
        if writer is None:
            return True
        parent = self._dir_stat(path.parent)
        if parent is not None and writable_by(parent, *writer):
            return True
        if content and path in self.files:
            return writable_by(self.files[path][1], *writer)
        return False

    def _scan(self) -> tuple[list[Path], list[Path]]:
        """(files whose bytes differ or that are gone, entries that are new); a stat per unchanged file."""
        differ, added = [], []
        for path, (data, st) in self.files.items():
            now = _lstat(path)
            if _key(now) == _key(st):
                continue
            try:
                if now is None or not stat.S_ISREG(now.st_mode) or now.st_size != len(data):
                    differ.append(path)
                    continue
                with open(path, "rb") as f:
                    if f.read() != data:
                        differ.append(path)
            except OSError:
                differ.append(path)
        for d, key in self.folders.items():
            now = _lstat(d)
            if _key(now) == key:
                continue  # no entry added, removed or renamed here
            in_tree = d in self.trees or any(d.is_relative_to(t) for t in self.trees)
            if in_tree and now is not None and not stat.S_ISDIR(now.st_mode):
                added.append(d)  # a package folder replaced by a link or a file
                continue
            for name in self._entries(d):
                p = d / name
                if in_tree:
                    real_dir = os.path.isdir(p) and not os.path.islink(p)
                    if not (p in self.folders if real_dir else p in self.files):
                        added.append(p)
                elif _is_hook(name) and p not in self.files and p not in self.hooks:
                    added.append(p)
        return differ, added

    def verify(self, writer: tuple[int, int] | None = None) -> tuple[list[Change], list[Change]]:
        """Restore what the worker changed; return (restored changes, changes it could not have made).

        ``writer`` is the (uid, gid) the worker ran as, or None if it ran as
        the grader's own user (then every change is the submission's).
        Bytecode caches count as neither: they are deleted when changed.
        """
        differ, added = self._scan()
        if not differ and not added:
            return [], []
        restored, foreign = [], []
        for path in added:
            change = Change(self._show(path), "added", _is_cache(path))
            if not self._could(path, writer, content=False):
                foreign.append(change)
                continue
            _remove(path)
            if not change.cache:
                restored.append(change)
        for path in differ:
            gone = not os.path.lexists(path)
            change = Change(self._show(path), "removed" if gone else "changed", _is_cache(path))
            if not self._could(path, writer, content=not gone):
                foreign.append(change)
                continue
            if change.cache:
                _remove(path)
                continue
            self._write(path)
            restored.append(change)
        # The snapshot's stats stay the reference: folders and files we touched are compared in full from
        # now on (an entry re-created between our restore and a new stat must not go unseen).
        return restored, [c for c in foreign if not c.cache]

    def _write(self, path: Path) -> None:
        """Put the snapshot's bytes back at ``path``, whatever is there now (a symlink, a folder)."""
        data, st = self.files[path]
        tree = next((t for t in self.trees if path.is_relative_to(t)), None)
        if tree is not None:  # inside a package: a folder on the way may have been replaced
            for parent in [tree, *(tree / q for q in reversed(path.relative_to(tree).parents[:-1]))]:
                if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                    _remove(parent)
            path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        tmp = path.with_name(f".{path.name}.grader-restore")
        _remove(tmp)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(data)
            if os.geteuid() == 0:
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
        os.replace(tmp, path)


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass
