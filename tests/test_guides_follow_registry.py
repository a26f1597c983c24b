"""The guides follow the registry: the teaching guide's table lists each chapter's graded
exercises, its hours add up to the total it states and both plans reach the last chapter; the
READMEs of exercises/ and solutions/ list each notebook's functions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grader.checks import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "book" / "instructors.md"
ROW = re.compile(r"^\| (\d+) [^|]+\| ([\d.]+) h \| ([\d.]+) h \| (.+) \|$")


def _rows() -> dict[int, tuple[float, float, list[str]]]:
    rows = {}
    for line in GUIDE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(3)), re.findall(r"`(\w+)`", m.group(4)))
    return rows


def test_each_chapter_lists_the_exercises_the_grader_grades():
    assert {n: fns for n, (_, _, fns) in _rows().items()} == _by_chapter()


def test_the_stated_total_is_the_sum_of_the_table():
    rows = _rows().values()
    reading, exercises = sum(r[0] for r in rows), sum(r[1] for r in rows)
    said = re.search(r"About ([\d.]+) hours in all: ([\d.]+) of reading and running, ([\d.]+) of exercises",
                     GUIDE.read_text())
    assert said, "the guide states the total hours"
    assert tuple(float(x) for x in said.groups()) == (reading + exercises, reading, exercises)


def test_both_plans_reach_the_last_chapter():
    text = GUIDE.read_text()
    last = max(_rows())
    plans = text.split("## Two plans", 1)[1].split("\n## ", 1)[0]
    assert plans.count(f"chapter {last}") >= 2, f"a plan never teaches chapter {last}"


def _by_chapter() -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name, ex in EXERCISES.items():
        out.setdefault(ex.chapter, []).append(name)
    return out


@pytest.mark.parametrize("folder", ["exercises", "solutions"])
def test_the_notebooks_readme_lists_every_graded_function(folder):
    listed = {int(m.group(1)): re.findall(r"`(\w+)`", m.group(2)) for m in re.finditer(
        r"^\| `ex(\d+)_\w+\.ipynb` \| (.+) \|$", (ROOT / folder / "README.md").read_text(), re.M)}
    assert listed == _by_chapter()


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "solutions").glob("ex*.ipynb")))
def test_each_notebooks_rules_name_everything_the_grader_bans(notebook):
    import json

    from grader.rules import FORBIDDEN_MODULES, FORBIDDEN_NAMES

    cells = json.loads((ROOT / "solutions" / notebook).read_text())["cells"]
    rules = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## Rules"))
    banned = [m for m in FORBIDDEN_MODULES if "." not in m]
    banned += [n for n in FORBIDDEN_NAMES if not n.startswith("_")]
    assert [name for name in banned if name not in rules] == []
