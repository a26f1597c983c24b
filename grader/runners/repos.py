"""The students' repositories of one GitHub Classroom assignment, without losing any.

``gh repo list ORG --limit 4000`` lists the whole organisation and cuts it off at 4000
without a word; filtering by prefix afterwards loses students silently once the
organisation holds more. This module asks GitHub for the assignment's repositories
only, page by page, and fails when the count it got is not the count GitHub reports:

* ``--assignment ID`` (best): GitHub Classroom's REST API,
  ``/assignments/ID/accepted_assignments``, checked against the assignment's
  ``accepted`` count; it also names each repository's students;
* else the search API, ``org:ORG PREFIX- in:name``, filtered again to names that start
  with ``PREFIX-`` and checked against ``total_count`` and ``incomplete_results``.
  Search returns at most 1000 results: more is a failure that says to use ``--assignment``.

``python -m grader repos list ORG PREFIX [--assignment ID] [--roster roster.csv]`` prints
one student name (the repository's name without ``PREFIX-``) per line and can write
them as a roster; ``python -m grader repos shard roster.csv --shard i/N`` prints the
names of one shard (:mod:`.shards`), so each job of a matrix clones only its own.
Every call goes through ``gh api`` (the GitHub CLI, authenticated by ``$GH_TOKEN``).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import rosterfile, shards

PER_PAGE = 100
SEARCH_CAP = 1000
#: ``(path, params) -> parsed JSON``: one GitHub API call (``gh api``, or a fake in tests).
Api = Callable[[str, dict[str, str]], Any]


def gh_api(path: str, params: dict[str, str]) -> Any:
    cmd = ["gh", "api", "-X", "GET", path, "-H", "Accept: application/vnd.github+json"]
    for k, v in params.items():
        cmd += ["-f", f"{k}={v}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SystemExit("the GitHub CLI `gh` is not installed (https://cli.github.com/); it lists the "
                         "repositories.") from None
    if proc.returncode != 0:
        raise SystemExit(f"`gh api {path}` failed: {proc.stderr.strip()[:500]}")
    return json.loads(proc.stdout)


def by_assignment(api: Api, assignment: str) -> list[str]:
    """Repository names of an assignment's accepted assignments, checked against ``accepted``."""
    expected = int(api(f"assignments/{assignment}", {}).get("accepted", -1))
    names: list[str] = []
    page = 1
    while True:
        batch = api(f"assignments/{assignment}/accepted_assignments", {"per_page": str(PER_PAGE),
                                                                      "page": str(page)})
        names += [a["repository"]["name"] for a in batch if a.get("repository")]
        if len(batch) < PER_PAGE:
            break
        page += 1
    if expected >= 0 and len(names) != expected:
        raise SystemExit(f"GitHub Classroom reports {expected} accepted assignments but listed {len(names)}: "
                         f"the listing is incomplete; nothing was graded. Run it again.")
    return names


def by_search(api: Api, org: str, prefix: str) -> list[str]:
    """Repository names in ``org`` starting with ``prefix-``, from the search API, checked."""
    query = f"org:{org} {prefix}- in:name fork:true"
    names, total, page = [], None, 1
    while True:
        data = api("search/repositories", {"q": query, "per_page": str(PER_PAGE), "page": str(page)})
        if data.get("incomplete_results"):
            raise SystemExit("GitHub's search timed out and returned incomplete results; nothing was graded. "
                             "Run it again, or list by assignment (--assignment ID).")
        total = int(data.get("total_count", 0))
        if total > SEARCH_CAP:
            raise SystemExit(f"the search finds {total} repositories, over the {SEARCH_CAP} GitHub's search "
                             f"returns: list by assignment instead (--assignment ID, GitHub Classroom's "
                             f"API).")
        items = data.get("items", [])
        names += [i["name"] for i in items]
        if len(items) < PER_PAGE or len(names) >= total:
            break
        page += 1
    if len(names) != total:
        raise SystemExit(f"the search reports {total} repositories but listed {len(names)}: the listing is "
                         f"incomplete; nothing was graded. Run it again.")
    return [n for n in names if n.startswith(f"{prefix}-")]


def student_names(repos: Sequence[str], prefix: str) -> list[str]:
    """``prefix-alice`` -> ``alice``: the folder the workflow clones into and the student's name."""
    return sorted({r[len(prefix) + 1:] if r.startswith(f"{prefix}-") else r for r in repos})


def write_roster(names: Sequence[str], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "name", "folder"])
        w.writerows([n, n, n] for n in names)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader repos",
                                description="List an assignment's student repositories completely, or one "
                                            "shard of a roster.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="the assignment's students, one per line")
    ls.add_argument("org")
    ls.add_argument("prefix", help="the assignment's repository prefix (repositories are PREFIX-USER)")
    ls.add_argument("--assignment", help="GitHub Classroom assignment id: list through Classroom's API")
    ls.add_argument("--roster", type=Path, help="also write them as a roster CSV (id,name,folder)")
    sh = sub.add_parser("shard", help="the roster's students in one shard, one per line")
    sh.add_argument("roster", type=Path)
    sh.add_argument("--shard", required=True, metavar="i/N")
    return p


def main(argv: Sequence[str] | None = None, *, api: Api = gh_api) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "shard":
        shard = shards.parse(args.shard)
        for e in rosterfile.read(args.roster):
            if shard.holds(e.shard_key):
                print(e.shard_key)
        return 0
    repos = by_assignment(api, args.assignment) if args.assignment else by_search(api, args.org, args.prefix)
    names = student_names(repos, args.prefix)
    if args.roster is not None:
        write_roster(names, args.roster)
    print("\n".join(names))
    print(f"{len(names)} repositories of {args.org}/{args.prefix}-*", file=sys.stderr)
    return 0
