"""The ways a grading is started, each a thin layer over :func:`grader.engine.grade`, in three
sub-packages whose imports run one way: ``platforms`` -> ``classmode`` -> ``single``.

* :mod:`.single` -- one grading, and the course's own commands: ``python -m grader SUBMISSION``,
  ``check()`` in a notebook, ``python -m grader release``;
* :mod:`.classmode` -- ``python -m grader class`` and ``merge``: a whole class graded, and its
  outputs (grades.csv, the class report, feedback files);
* :mod:`.platforms` -- where a class's work comes from and its grades go: Classroom 50,
  Gradescope, GitHub, gradebook exports, an assignment's repositories.
"""
