"""Class mode's rows and its manifest: ``OUT/manifest.json`` keeps, per student, the key of the
last grading (files, seed, options, grader) and its :class:`Row`, so a rerun can skip what has
not changed."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .scores import read_results

MANIFEST_VERSION = 1


@dataclass
class Row:
    student: str
    slug: str
    status: str  # graded | not graded | timeout | crashed | empty
    message: str
    total: float = 0.0
    max: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False  # unchanged since the last run: not regraded
    isolation: str = ""  # "held", "NOT HELD: why", or "" (see scores.isolation)


class Manifest:
    """OUT/manifest.json: per student, the key of the last grading (files, seed, options,
    grader) and its row, so a rerun can skip what has not changed."""

    def __init__(self, path: Path):
        self.path, self.lock = path, threading.Lock()
        self.data: dict[str, Any] = {"version": MANIFEST_VERSION, "seed": None, "students": {}}
        try:
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict) and loaded.get("version") == MANIFEST_VERSION:
                self.data = loaded
        except (OSError, ValueError):
            pass

    def unchanged(self, slug: str, key: str, out: Path) -> Row | None:
        entry = self.data["students"].get(slug)
        if not entry or entry.get("key") != key or read_results(out / slug / "results.json") is None:
            return None
        if entry.get("row", {}).get("status") == "not graded":  # the grader's failure, not the submission's
            return None
        row = Row(**entry["row"])
        row.skipped = True
        return row

    def record(self, row: Row, key: str) -> None:
        with self.lock:
            saved = asdict(row)
            saved["skipped"] = False
            self.data["students"][row.slug] = {"key": key, "row": saved}
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            tmp.replace(self.path)  # a killed run never leaves half a manifest
