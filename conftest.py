"""Root pytest configuration: what nbval must not collect, and torch's threads under xdist."""

import os

import torch

# Chapter 13's Triton kernels run in Triton's CPU interpreter where there is no CUDA device, and
# TRITON_INTERPRET is read when triton is first imported: set it here, before any test or module
# imports triton (a test module setting it itself is too late once another one imported triton).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Only book chapters and solution notebooks are compared by nbval. Exercise
# notebooks are stubs (they raise NotImplementedError by design), test fixtures
# are deliberately broken, and the build folder holds executed copies.
collect_ignore_glob = ["exercises/*", "tests/**/*.ipynb", "book/_build/*", "build/*"]


def pytest_configure(config):
    """Under pytest-xdist, share the cores between the workers: torch's own threads default to
    every core, and N workers each running that many spin waiting for a core (0.01 s of work took
    0.5 s). Class mode gives each grading process one thread for the same reason. Notebook kernels
    and grader processes are not affected: they are other processes."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // int(workers)))
