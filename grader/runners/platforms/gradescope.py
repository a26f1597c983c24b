"""Gradescope autograder bundle: build it, and the grading step it runs.

``python -m grader gradescope build OUT_DIR [--seed N]`` writes ``OUT_DIR/autograder/``
and ``OUT_DIR/autograder.zip`` (upload the zip to Gradescope). The zip holds, at its
root: ``setup.sh`` (run once when Gradescope builds the image: a Python 3.11 venv with
the pinned runtime requirements and this bundle's packages), ``run_autograder`` (run for
every submission), ``requirements.txt``, ``pyproject.toml``, ``README.md``, the packages
``attnmask`` and ``grader``, and ``grader_seed`` -- the hidden-case seed, which only the
instructor and Gradescope see.

``python -m grader gradescope run`` is what ``run_autograder`` calls: it copies
``$AUTOGRADER_ROOT/submission`` (default ``/autograder``) to a scratch folder, grades it
with the engine's CLI under a wall-time limit, and always leaves a valid
``results/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from ... import seed as seed_mod
from ...seed import SEED_ENV
from ..classmode.processes import log_tail, run_limited, single_thread_env
from ..classmode.roster import grading_target
from ..classmode.scores import failure_results, read_results
from ..single.checkout import HERE, course_root
from .github import runtime_requirements

REPO = Path(__file__).resolve().parents[3]
#: What the bundle copies from the course repository, besides the packages.
BUNDLED = ("requirements.txt", "pyproject.toml", "README.md")
TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "gradescope"
SEED_FILE = "grader_seed"
VISIBILITY_FILE = "grader_visibility"
#: Gradescope's visibility settings for a test's feedback.
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
#: Gradescope's default overall limit is 10 minutes; stop a little earlier so the
#: student still gets a results file that says why.
DEFAULT_TIMEOUT = 540.0
_EXECUTABLE = stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH


def build(out_dir: Path, *, seed: int, visibility: str = "visible", repo: Path = REPO,
          packages: Path = REPO) -> Path:
    """Write the bundle folder and its zip into ``out_dir``; returns the zip's path.

    ``visibility`` is when students see each exercise's score and feedback (Gradescope's
    per-test setting, e.g. ``after_due_date``); the default shows them at once. ``repo``: the
    course repository (:data:`BUNDLED` comes from it); ``packages``: the folder that holds
    the ``attnmask`` and ``grader`` to bundle (this grader's: a checkout, or an installed wheel's).
    """
    if visibility not in VISIBILITIES:
        raise SystemExit(f"visibility must be one of {', '.join(VISIBILITIES)}; got {visibility!r}.")
    bundle = out_dir / "autograder"
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for pkg in ("attnmask", "grader"):
        if not (packages / pkg / "__init__.py").is_file():
            raise SystemExit(f"{packages / pkg} is not a package; expected the course's packages in "
                             f"{packages}.")
        shutil.copytree(packages / pkg, bundle / pkg, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, bundle / name)
    # Gradescope installs the bundle itself (setup.sh), not the repository in editable mode.
    reqs = runtime_requirements((repo / "requirements.txt").read_text(), keep_editable=False,
                                grading_only=True)
    (bundle / "requirements.txt").write_text(reqs)
    for name in ("setup.sh", "run_autograder"):
        shutil.copy2(TEMPLATES / name, bundle / name)
        (bundle / name).chmod(_EXECUTABLE)
    (bundle / SEED_FILE).write_text(f"{seed}\n")
    (bundle / SEED_FILE).chmod(0o600)  # the seed: the instructor's alone, as class mode's files
    (bundle / VISIBILITY_FILE).write_text(f"{visibility}\n")
    zip_path = out_dir / "autograder.zip"
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(bundle.rglob("*")):
            if f.is_file():
                info = zipfile.ZipInfo.from_file(f, f.relative_to(bundle).as_posix())
                # Unix permissions live in the high 16 bits: run_autograder must stay executable.
                info.external_attr = (f.stat().st_mode & 0xFFFF) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, f.read_bytes())
    zip_path.chmod(0o600)  # it holds the seed
    return zip_path


def run(root: Path, *, timeout: float = DEFAULT_TIMEOUT, python: str = sys.executable) -> dict:
    """Grade ``root/submission`` into ``root/results/results.json`` (Gradescope's layout)."""
    source, submission = root / "source", root / "submission"
    results_dir = root / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    final = results_dir / "results.json"
    final.unlink(missing_ok=True)
    seed_file = source / SEED_FILE
    try:
        seed_text = seed_file.read_text()
        seed = int(seed_text.strip())
    except (OSError, ValueError) as e:
        results = failure_results(f"The autograder bundle has no valid {SEED_FILE} ({e}); rebuild it with "
                                  f"`python -m grader gradescope build`. Not your code's fault.")
        final.write_text(json.dumps(results, indent=2))
        return results
    # While student code runs, the seed is in no file: the sandbox's user may be able to read
    # any file (it keeps CAP_DAC_READ_SEARCH where Python's own files are not world-readable).
    try:
        seed_file.unlink()
    except OSError:
        pass
    _lock_answers(root)
    try:
        results = _grade_submission(submission, seed, timeout, python)
    finally:
        if not seed_file.exists():
            seed_file.write_text(seed_text)
            os.chmod(seed_file, 0o600)
    try:
        visibility = (source / VISIBILITY_FILE).read_text().strip()
    except OSError:
        visibility = "visible"
    results = withhold(results, visibility)
    final.write_text(json.dumps(hide_seed(results, seed), indent=2))
    return results


#: What students read on Gradescope before the instructor's chosen moment.
WITHHELD = {
    "after_due_date": "Your submission was received and graded. Scores and feedback appear after the due "
                      "date.",
    "after_published": "Your submission was received and graded. Scores and feedback appear when your "
                       "instructor publishes the grades.",
    "hidden": "Your submission was received and graded. Your instructor has chosen not to show the results.",
}


def withhold(results: dict, visibility: str) -> dict:
    """``results`` as students may see them under ``visibility``: every test entry and the
    top level carry the setting, and the top-level ``output`` (which Gradescope shows at
    once, whatever the setting) says only that grading happened. The full text stays in
    the autograder's stdout, which only staff see."""
    if visibility == "visible":
        return results
    results = dict(results)
    # One test entry per exercise, public and hidden checks together: the whole entry waits.
    results["tests"] = [{**t, "visibility": visibility} for t in results.get("tests", [])]
    results["visibility"] = visibility
    print(results.get("output", ""))  # for staff
    results["output"] = WITHHELD.get(visibility, WITHHELD["hidden"])
    return results


def _lock_answers(root: Path) -> None:
    """Make the bundle's reference package readable by root alone: student code runs inside
    bubblewrap, where these folders do not exist; this is a second lock on them. Only folders
    inside the autograder (its source and its virtual environment) are touched; the grader
    (root) still reads them."""
    from ...rules import reference_folders
    from ...sandbox.allowlist import secret_paths

    inside = [os.path.realpath(root), os.path.realpath(sys.prefix)]
    for folder in reference_folders(secret_paths()):
        real = os.path.realpath(folder)
        if any(real.startswith(base + os.sep) for base in inside):
            try:
                os.chmod(real, 0o700)
            except OSError:
                pass


def _grade_submission(submission: Path, seed: int, timeout: float, python: str) -> dict:
    """The results of grading a scratch copy of ``submission`` with ``seed`` (never raises)."""
    with tempfile.TemporaryDirectory(prefix="grading-") as tmp:
        work = Path(tmp) / "submission"
        # The student's code runs against a scratch copy, never the harness's files.
        if submission.is_dir():
            shutil.copytree(submission, work, symlinks=True)
        else:
            work.mkdir()
        target = grading_target(work)
        if target is None:
            names = ", ".join(sorted(p.name for p in work.iterdir())) or "nothing"
            results = failure_results(f"No notebook (.ipynb) or .py file was found in your submission (it "
                                      f"holds: {names}). Upload your exercise notebooks, e.g. "
                                      f"ex01_leakage.ipynb.")
        else:
            # The engine writes to a name nobody can guess; only this process writes results/.
            private = Path(tmp) / f"results-{secrets.token_hex(16)}.json"
            # The seed goes by environment, not argv: /proc/PID/cmdline is readable by every
            # process, the student's sandbox included; /proc/PID/environ only by its owner.
            argv = [python, "-m", "grader", str(target), "--json", str(private)]
            env = single_thread_env()
            env[SEED_ENV] = str(seed)
            log = Path(tmp) / "grader.log"
            res = run_limited(argv, timeout=timeout, log=log, env=env, cwd=Path(tmp))
            sys.stdout.write(log.read_text(errors="replace")[-20000:])  # Gradescope keeps stdout for staff
            results = None if res.timed_out else read_results(private)
            if res.timed_out:
                results = failure_results(f"Grading took longer than {timeout:g} s and was stopped. Look for "
                                          f"an infinite loop or very slow code, especially at import time.")
            elif results is None:
                results = failure_results(f"The grader stopped (exit status {res.returncode}) before writing "
                                          f"results; last output: {log_tail(log) or '(none)'}. Please tell "
                                          f"your instructor.")
    return results


def hide_seed(results: dict, seed: int) -> dict:
    """Take the secret seed out of what students see on Gradescope.

    The engine names its seed in every report so that any run can be reproduced;
    on Gradescope students read ``output`` and the tests' ``output``, and anyone who
    knows the seed can precompute the hidden cases. The seed stays in the autograder's
    stdout, which only staff see.
    """
    pattern = re.compile(rf"(--seed[ =]|\bseed\s+){seed}\b")

    def scrub(x):
        if isinstance(x, str):
            return pattern.sub(lambda m: m.group(1) + "<instructor's seed>", x)
        if isinstance(x, list):
            return [scrub(v) for v in x]
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if k != "seed"}
        return x

    return scrub(results)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader gradescope",
                                description="Build a Gradescope autograder bundle, or run it "
                                            "(Gradescope's side).")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write OUT_DIR/autograder/ and OUT_DIR/autograder.zip")
    b.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    b.add_argument("--seed", type=int, help="hidden-case seed baked into the bundle (default: $GRADER_SEED)")
    b.add_argument("--visibility", choices=VISIBILITIES, default="visible",
                   help="when students see each exercise's feedback (default: %(default)s)")
    r = sub.add_parser("run", help="grade $AUTOGRADER_ROOT/submission (what run_autograder calls)")
    r.add_argument("--timeout", type=float,
                   default=float(os.environ.get("AUTOGRADER_TIMEOUT", DEFAULT_TIMEOUT)),
                   help="wall-time limit in seconds (default $AUTOGRADER_TIMEOUT or %(default)s)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        seed, origin = seed_mod.for_command(args.seed)
        repo = course_root(BUNDLED, "python -m grader gradescope build")
        zip_path = build(args.out_dir, seed=seed, visibility=args.visibility, repo=repo, packages=HERE)
        print(f"Gradescope bundle: {zip_path} (seed {seed}, {origin}). Upload the zip as the assignment's "
              f"autograder; keep it private -- it holds the seed.")
        return 0
    root = os.environ.get("AUTOGRADER_ROOT", "/autograder")
    results = run(Path(root), timeout=args.timeout)
    print(f"\nscore {results.get('score')} -> {root}/results/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
