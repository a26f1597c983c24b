"""``python -m grader``: see :mod:`grader.cli`."""

import sys

from .cli import main

sys.exit(main())
