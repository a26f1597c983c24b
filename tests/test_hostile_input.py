"""Names, paths and strings from a submission or a shard are hostile input to the parent:
each class of them here, tried by a submission, a class folder or a forged shard.

One rule cleans them (:mod:`grader.safetext`): a lone surrogate, a byte that is not UTF-8 and
an escape sequence come out as visible escapes; a shard's folder name must be one folder;
the code the parent parses is bounded (:data:`grader.submission.MAX_PARSED_CHARS`).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from grader import safetext, submission
from grader.runners.classmode import classroom, merge

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ("causal_mask", "attention")
FAKE = r'''
import json, sys
from pathlib import Path
out = Path(sys.argv[2])
tests = [{"name": f"{n} (chapter 1)", "score": 10, "max_score": 10, "output": "ok"}
         for n in ("causal_mask", "attention")]
out.write_text(json.dumps({"score": 20, "max_score": 20, "tests": tests}))
'''


def _fake(tmp_path: Path):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    return lambda sub, results, seed, extra: [sys.executable, str(script), str(sub), str(results), str(seed)]


def _class(tmp_path: Path, out: Path, command, *more: str) -> int:
    return classroom.main([str(tmp_path / "subs"), "--out", str(out), "--jobs", "1", "--seed",
                           "918273645546372819", "--no-progress", "--no-report", *more],
                          command=command, exercises=EXERCISES)


def test_the_rule_escapes_what_no_utf8_file_or_terminal_should_hold():
    said = "bad \ud800 \udcff \x1b[2J\u202e\r"
    text = safetext.text(said + "\nnext")
    text.encode("utf-8")  # no lone surrogate is left
    assert "\x1b" not in text and "\\x1b[2J" in text and "\\xff" in text and "\\ud800" in text
    assert text.endswith("\nnext") and "\n" not in safetext.name("a\nb")
    assert safetext.name("st\udcff") != safetext.name("st\udcfe")  # two names stay two
    assert not [s for s in ("..", ".", "../x", "a/b", "", "x\x00") if safetext.component(s)]
    assert safetext.component("student-01_a.b")


def test_a_lone_surrogate_in_what_student_code_raises_is_written(tmp_path):
    sub = tmp_path / "sur.py"
    sub.write_text('def causal_mask(n, *, device=None):\n    raise ValueError("bad \\ud800 here")\n\n'
                   'if True:\n    raise ValueError("load \\udcff")\n')
    out = tmp_path / "results.json"
    p = subprocess.run([sys.executable, "-m", "grader", str(sub), "--exercise", "causal_mask",
                        "--public-only", "--json", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert "bad \\\\ud800 here" in text and "load \\\\xff" in text  # shown, escaped


def test_names_that_are_not_utf8_or_hold_escapes_cost_no_row(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    os.mkdir(os.fsencode(subs) + b"/st\xff")
    (Path(os.fsdecode(os.fsencode(subs) + b"/st\xff")) / "a.py").write_text("x = 1\n")
    (subs / "a\x1b[31mred\x1b[0m.py").write_text("x = 1\n")
    (subs / "plain.py").write_text("x = 1\n")
    (subs / "esc\x1b]0;title\x07.txt").write_text("not a student")
    assert _class(tmp_path, tmp_path / "out", _fake(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "esc\\x1b]0;title\\x07.txt" in err
    with open(tmp_path / "out" / "grades.csv", newline="", encoding="utf-8") as f:
        names = [r["student"] for r in csv.DictReader(f)]
    assert sorted(names) == sorted(["a\\x1b[31mred\\x1b[0m", "plain", "st\\xff"])


def test_a_forged_shard_cannot_make_merge_write_outside_out(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    for i in range(4):
        (subs / f"student{i}.py").write_text("x = 1\n")
    shard = tmp_path / "shard-0"
    assert _class(tmp_path, shard, _fake(tmp_path)) == 0
    record = json.loads((shard / "class-run.json").read_text())
    row = record["rows"][0]
    evil = tmp_path / "shard-1" / "evil"  # what the forger prepared beside the shard
    evil.mkdir(parents=True)
    (evil / "results.json").write_text((shard / row["slug"] / "results.json").read_text())
    row["slug"] = "../shard-1/evil"
    (shard / "class-run.json").write_text(json.dumps(record))
    out = tmp_path / "merged" / "out"
    # issue 38: merge refuses the forged row (naming the shard and the row) and writes nothing
    with pytest.raises(SystemExit) as refused:
        merge.main([str(shard), "--out", str(out), "--no-report"])
    assert "refusing to merge" in str(refused.value) and "shard-0" in str(refused.value)
    assert "row 1" in str(refused.value) and "../shard-1/evil" in str(refused.value)
    assert not (tmp_path / "merged" / "shard-1").exists()  # out/../shard-1/evil
    assert not (out / "grades.csv").exists()


def test_huge_literals_are_not_parsed_by_the_grading_process(tmp_path):
    """Three 2 MiB list literals took the parent to 1.8 GiB and a minute: the code it parses is
    bounded, and what it could not parse is named, the rest still read."""
    sub = tmp_path / "big.py"
    sub.write_text("import torch\n" + "".join(f"A{i} = [" + "1," * 2**20 + "]\n" for i in range(3))
                   + "\n\ndef causal_mask(n, *, device=None):\n    return torch.ones(n, n).bool().tril()\n")
    tracemalloc.start()
    try:
        src = submission.read(sub)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"reading it took {peak / 2**20:.0f} MiB"
    assert any("causal_mask" in submission.defined_names(c) for c, _ in src.trees())
    assert any("TooLarge" in err for _, err in src.syntax_errors)
