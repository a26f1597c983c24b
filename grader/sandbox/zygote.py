"""The workers' zygote: a fork server inside bubblewrap whose children become sandbox workers.

``python -s -P -m grader.sandbox.zygote SOCKET confined``, started by :class:`Zygote`
inside the sandbox (:mod:`grader.sandbox.allowlist`; the workers' own flags, a
scrubbed environment, ``PYTHONHASHSEED=0``), imports torch and the worker's modules
only -- never the reference, the checks or any case. Each child moves into namespaces
of its own (:mod:`grader.sandbox.namespaces`) and becomes a worker
(:func:`grader.sandbox.worker.serve`). Every grading asks one through :func:`spawn`:
class mode's, named by ``GRADER_ZYGOTE``, or a zygote of its own (:func:`for_grading`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .forkserver import Forked, Server, request, serve, socket_folder
from .limits import worker_env

#: Environment variables naming the zygote's socket, and whether it is confined, for the
#: grading processes of a class run.
ZYGOTE_ENV, CONFINED_ENV = "GRADER_ZYGOTE", "GRADER_ZYGOTE_CONFINED"
#: Set (to "1") in class mode's zygote's environment where there is no NVIDIA driver: chapter 13's
#: kernels then run in Triton's interpreter, which triton chooses when it is imported, and the zygote
#: imports it once for all its workers (0.1-0.2 CPU-s each). With a driver, triton is left to the
#: workers: asking CUDA anything before the fork would spoil it for them.
INTERPRET = "TRITON_INTERPRET"


def _no_nvidia_driver() -> bool:
    return not (os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl"))


def spawn(socket_path: str | os.PathLike, *, stdout: int, stderr: int, status: int, results: int,
          header: dict) -> Forked | None:
    """Ask the zygote at ``socket_path`` for a worker; None if it does not answer.
    ``stdout``, ``stderr``, ``status``, ``results``: descriptors the worker gets as 1, 2, its
    status pipe and the file it writes its records to; ``header``: its folder (``cwd``),
    environment and, for a worker in namespaces of its own, ``confined``."""
    stdin_r, stdin_w = os.pipe()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    proc = request(socket_path, [stdin_r, stdout, stderr, status, results], {**header, "cpus": cpus})
    os.close(stdin_r)
    if proc is None:
        os.close(stdin_w)
        return None
    proc.stdin = os.fdopen(stdin_w, "wb")
    return proc


class Zygote(Server):
    """The workers' zygote: inside bubblewrap (``confined``), or without it where the user
    asked for that. :meth:`env` gives the variable a class's gradings need."""

    def __init__(self, confined: bool = True, *, triton: bool = False) -> None:
        """``triton``: import triton ahead for the workers where it runs interpreted (:data:`INTERPRET`);
        class mode's zygote does, a single grading's does not (it waits for its zygote, and most
        submissions are not chapter 13's)."""
        from . import allowlist

        self.confined = confined
        flags = ("-s", "-P") if sys.version_info >= (3, 11) else ("-s",)
        interpret = {INTERPRET: "1"} if triton and _no_nvidia_driver() else {}
        if confined:
            env = {**worker_env(Path("/tmp")), **interpret}
            env["PYTHONPATH"] = allowlist.sandbox_pythonpath()
            folder = socket_folder("grader-zygote-")
            try:
                prefix = tuple(allowlist.command(folder))
            except allowlist.Unavailable:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            super().__init__("grader.sandbox.zygote", env, flags=flags, prefix=prefix, folder=folder,
                             inside=allowlist.SHARED, args=("confined",), python=allowlist.interpreter())
            self.home = None
        else:
            self.home = Path(tempfile.mkdtemp(prefix="grader-zygote-home-"))
            env = {**worker_env(self.home), **interpret}
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
            super().__init__("grader.sandbox.zygote", env, flags=flags, cwd=self.home)

    def env(self) -> dict[str, str]:
        return {ZYGOTE_ENV: str(self.socket), CONFINED_ENV: "1" if self.confined else "0"}

    def close(self) -> None:
        super().close()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def for_grading(unconfined: bool = False) -> tuple[Zygote | str | None, bool, str | None]:
    """Where a grading's workers come from: (class mode's zygote socket, or a zygote of its
    own; whether it is confined; None, or why no student code may run)."""
    from . import allowlist

    shared = os.environ.get(ZYGOTE_ENV)
    if shared:
        return shared, os.environ.get(CONFINED_ENV, "1") != "0", None
    if unconfined and allowlist.unconfined_refused() is None:
        return Zygote(confined=False), False, None
    try:
        return Zygote(), True, None
    except allowlist.Unavailable as e:
        return None, True, allowlist.refusal(e, unconfined=unconfined)


def _become_worker(req: dict, extra: list[int]) -> int:
    """The zygote's body: be what ``python -m grader.sandbox.worker STATUS RESULTS`` is, inside
    namespaces of its own when the zygote is confined (``confined``)."""
    from . import worker

    if len(extra) != 2:
        raise ValueError("a worker needs its status pipe and its results file")
    confined = req.get("confined") is True
    if confined:
        from . import namespaces

        try:
            namespaces.isolate()
        except OSError as e:  # refused by the kernel, before any student code: say why, in one bounded line
            os.write(extra[0], f"refused {str(e)[:200]}\n".encode("ascii", "replace"))
            return 3
    sys.argv = [worker.__file__, *map(str, extra)]  # as `-m grader.sandbox.worker` has it
    worker.serve(extra[0], extra[1], confined=confined)
    return 0


if __name__ == "__main__":  # the workers' zygote
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m grader.sandbox.zygote SOCKET [confined] (started by the grader)")
    import torch  # noqa: F401 -- the point of the zygote

    if os.environ.get(INTERPRET) == "1":  # chapter 13's notebooks import it: once here, not per worker
        try:
            import triton  # noqa: F401
        except ImportError:
            pass

    from . import worker

    worker.prepare()
    serve(sys.argv[1], _become_worker)
    os._exit(0)  # skip tearing torch down: nothing is left to clean up
