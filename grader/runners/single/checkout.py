"""Where the course repository is, for the commands that read more of it than the packages.

``release`` reads ``solutions/`` and writes ``exercises/``; ``gradescope build`` copies
``requirements.txt``, ``pyproject.toml`` and ``README.md`` beside the packages. In a
checkout they lie beside ``grader/``; an installed wheel has only the packages, so
those commands then work on the course repository the user stands in.
"""

from __future__ import annotations

from pathlib import Path

#: The folder that holds this ``grader`` package: a checkout, or site-packages for a wheel.
HERE = Path(__file__).resolve().parents[3]


class NoCheckout(SystemExit):
    """No course repository here: the message says where it looked and what to do."""


def course_root(needs: tuple[str, ...], what: str) -> Path:
    """The course repository that holds every path of ``needs``: the one this grader lies in,
    else the current directory; :class:`NoCheckout` (one line, for the user) if neither."""
    for folder in dict.fromkeys((HERE, Path.cwd().resolve())):
        if all((folder / name).exists() for name in needs):
            return folder
    missing = ", ".join(n for n in needs if not (Path.cwd() / n).exists())
    raise NoCheckout(f"{what} needs the course repository ({', '.join(needs)}); the installed grader at "
                     f"{HERE} has only its packages, and the current directory {Path.cwd()} lacks "
                     f"{missing}. Run it from the root of a clone of the course.")
