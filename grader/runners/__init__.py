"""The ways a grading is started, each a thin layer over :func:`grader.engine.grade`.

* :mod:`.cli` -- ``python -m grader SUBMISSION``;
* :mod:`.notebook` -- ``from grader import check`` inside a notebook;
* :mod:`.classroom` -- ``python -m grader class``: a whole class, with :mod:`.roster`,
  :mod:`.processes` (one grading under a time limit; the gradings' fork server) and
  :mod:`.scores`;
* :mod:`.github` -- GitHub Classroom's template repository and outputs;
* :mod:`.gradescope` -- the Gradescope bundle and its run;
* :mod:`.release` -- ``exercises/`` written from ``solutions/``.
"""
