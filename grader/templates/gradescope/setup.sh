#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
# Generated into the bundle by `python -m grader gradescope build`; source:
# grader/templates/gradescope/setup.sh in the course repository -- edit it there.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SRC="$ROOT/source"

# Student code runs inside bubblewrap; without it the grader refuses to run student code as root.
command -v bwrap >/dev/null || { apt-get update -q && apt-get install -y -q bubblewrap; }

# The course is tested on Python 3.11; the Ubuntu 22.04 base image ships 3.10.
PY=""
for cand in python3.11 python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    PY="$cand"; break
  fi
done
if [ -z "$PY" ]; then
  if apt-get update -q && apt-get install -y -q python3.11 python3.11-venv && command -v python3.11 >/dev/null; then
    PY=python3.11
  else
    echo "python3.11 unavailable; falling back to $(python3 --version)" >&2; PY=python3
  fi
fi
if ! "$PY" -m venv "$ROOT/venv" 2>/dev/null; then
  apt-get update -q && apt-get install -y -q "$(basename "$PY")-venv"
  "$PY" -m venv "$ROOT/venv"
fi
VPY="$ROOT/venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VPY" -m pip install -q --upgrade pip
# The CPU wheel index keeps torch at a few hundred MB instead of the multi-GB CUDA build.
"$VPY" -m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu -r "$SRC/requirements.txt"
# The bundle installed as a package, as `pip install .` installs the course anywhere (the wheel
# that tests/test_install.py builds and grades from).
"$VPY" -m pip install -q --no-deps "$SRC"
# Import once now so no student's submission pays for the first-import bytecode compilation, and
# every subpackage, so that an incomplete install fails here rather than on a student's submission.
"$VPY" -c "import torch, attnmask, grader.runners.single.cli, grader.sandbox.worker, grader.checks.recorded; print('autograder ready: torch', torch.__version__)"
