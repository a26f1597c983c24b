"""Build the Jupyter Book (static HTML) from the chapters' stored outputs.

    python scripts/build_book.py                  # -> book/_build/html
    python scripts/build_book.py --out /tmp/site  # -> /tmp/site/_build/html
    python scripts/build_book.py --strict         # every warning is an error
    python scripts/build_book.py --repo-url https://github.com/OWNER/REPO [--branch main]
                                                  # the web build: GitHub and Colab links

Nothing is executed: chapters are committed executed (refresh them with
``python scripts/run_notebooks.py book/XX.ipynb``) and nbval checks that the
stored outputs still match a fresh run. The build needs no network.

Warnings are sorted into two kinds. *Pending* ones name a file that is listed
but does not exist yet -- a chapter in ``book/_toc.yml`` or an exercise
notebook linked with ``{download}`` -- and are tolerated unless ``--strict``
is given, so the book builds while chapters are being written. Every other
warning (a broken reference, a bad directive, a chapter that was never
executed) fails the build.

``--repo-url`` builds the site for the web (``.github/workflows/book.yml``): for
that build only, through a temporary copy of ``book/_config.yml``
(:func:`web_config`), each chapter gets its page's repository and Colab buttons
and, under its title, its exercise notebook on GitHub with an "Open in Colab"
link (``scripts/exercise_links.py``). The committed config, and so the default
build, stays offline.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

# Sphinx wording for "listed but missing" warnings ({doc} links to a missing
# chapter are matched in build(), against the chapters actually missing).
PENDING = (
    re.compile(r"toctree contains reference to nonexisting document '([^']+)'"),
    re.compile(r"download file not readable: (\S+)"),
)
WARNING = re.compile(r"\bWARNING\b|\bERROR\b")


def toc_files(toc_path: Path = BOOK / "_toc.yml") -> list[str]:
    """Every ``file:`` entry of the table of contents, in order (without suffix)."""
    toc = yaml.safe_load(toc_path.read_text())
    found = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return found


def source_of(entry: str, book: Path = BOOK) -> Path | None:
    """The file behind a toc entry (``.ipynb`` or ``.md``), or None if missing."""
    for suffix in (".ipynb", ".md"):
        path = book / f"{entry}{suffix}"
        if path.exists():
            return path
    return None


def unexecuted(path: Path) -> bool:
    """True when a notebook has a code cell that was never run: the book
    would show it without outputs."""
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and c.source.strip() and c.execution_count is None
               for c in nb.cells)


COLAB = "https://colab.research.google.com"
_REPO_URL = re.compile(r"https://[^\s/]+(/[^\s/]+)+")


def web_config(repo_url: str, branch: str = "main", config: Path = BOOK / "_config.yml") -> dict:
    """``config`` for the web build: the repository's buttons, Colab's launch button where the
    repository is on GitHub, and the exercise links of ``scripts/exercise_links.py``."""
    if not _REPO_URL.fullmatch(repo_url.rstrip("/")):
        raise ValueError(f"--repo-url is {repo_url!r}; expected the repository's web address, "
                         "e.g. https://github.com/OWNER/REPO")
    repo_url = repo_url.rstrip("/")
    cfg = yaml.safe_load(config.read_text())
    cfg["repository"] = {"url": repo_url, "branch": branch, "path_to_book": "book"}
    cfg.setdefault("html", {})["use_repository_button"] = True
    if repo_url.startswith("https://github.com/"):
        cfg.setdefault("launch_buttons", {})["colab_url"] = COLAB
    sphinx = cfg.setdefault("sphinx", {})
    sphinx.setdefault("local_extensions", {})["exercise_links"] = str(ROOT / "scripts")
    sphinx.setdefault("config", {}).update(course_repo_url=repo_url, course_branch=branch)
    return cfg


def build(out: Path, strict: bool = False, verbose: bool = False, repo_url: str | None = None,
          branch: str = "main", book: Path = BOOK) -> tuple[int, dict]:
    """Run the build of ``book`` (with ``repo_url``: the web build, :func:`web_config`); return
    (exit code, report)."""
    report: dict = {"missing": [], "pending": [], "problems": [], "seconds": 0.0}
    for entry in toc_files(book / "_toc.yml"):
        path = source_of(entry, book)
        if path is None:
            report["missing"].append(entry)
        elif path.suffix == ".ipynb" and unexecuted(path):
            report["problems"].append(
                f"{path.relative_to(ROOT)} has cells without stored outputs: "
                f"run python scripts/run_notebooks.py {path.relative_to(ROOT)}"
            )

    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
           "build", str(book), "--path-output", str(out), "--all", "--builder", "html"]
    if repo_url is not None:
        out.mkdir(parents=True, exist_ok=True)
        config = out / "_web_config.yml"  # beside the site, never book/_config.yml
        config.write_text(yaml.safe_dump(web_config(repo_url, branch, book / "_config.yml"), sort_keys=False))
        cmd += ["--config", str(config)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    report["seconds"] = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if verbose:
        print(log)
    names = "|".join(map(re.escape, report["missing"])) or r"(?!)"
    missing_ref = re.compile(rf"unknown document: '(?:\./)?(?:{names})'")
    for line in log.splitlines():
        if not WARNING.search(line):
            continue
        line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        if any(p.search(line) for p in PENDING) or missing_ref.search(line):
            report["pending"].append(line)
        else:
            report["problems"].append(line)

    html = out / "_build" / "html"
    if proc.returncode != 0 or not (html / "index.html").exists():
        report["problems"].append(f"jupyter-book exited with {proc.returncode}:\n{log[-3000:]}")
    if strict:
        report["problems"] += report.pop("pending")
        report["pending"] = []
    return (1 if report["problems"] else 0), report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BOOK,
                        help="output folder; the site goes to OUT/_build/html (default: book)")
    parser.add_argument("--strict", action="store_true",
                        help="fail on every warning, including chapters or exercises not written yet")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the full Sphinx log")
    parser.add_argument("--repo-url", metavar="URL",
                        help="the course's repository (https://github.com/OWNER/REPO): build for the web, "
                             "with each chapter's exercise notebook on GitHub and in Colab")
    parser.add_argument("--branch", default="main", help="the branch the links point at (default: main)")
    args = parser.parse_args(argv)

    try:
        code, report = build(args.out.resolve(), strict=args.strict, verbose=args.verbose,
                             repo_url=args.repo_url, branch=args.branch)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    html = args.out.resolve() / "_build" / "html"
    for entry in report["missing"]:
        print(f"pending: book/{entry} is listed in book/_toc.yml but does not exist yet")
    for line in report["pending"]:
        print(f"pending: {line}")
    for line in report["problems"]:
        print(f"error: {line}")
    status = "failed" if code else "built"
    print(f"{status} in {report['seconds']:.1f} s: {html / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
