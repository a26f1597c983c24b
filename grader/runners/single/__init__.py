"""One grading, and the course's own commands.

* :mod:`.cli` -- ``python -m grader SUBMISSION``, with :mod:`.scope` (which exercises
  one submission is meant to hold);
* :mod:`.notebook` -- ``from grader import check`` inside a notebook;
* :mod:`.release` -- ``exercises/`` written from ``solutions/``, with :mod:`.checkout` (where
  the course repository is).
"""
