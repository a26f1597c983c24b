"""Execute notebooks in place so their stored outputs are fresh (what nbval compares).

    python scripts/run_notebooks.py book/*.ipynb solutions/*.ipynb

Each notebook runs in a fresh kernel of this Python, with its own folder as the
working directory, seeds fixed by its first cell. Stops at the first error.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    t0 = time.perf_counter()
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(Path("book").glob("*.ipynb"))
    for p in paths:
        print(f"{p}: {run(p):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
