"""The ways a grading is started, each a thin layer over :func:`grader.engine.grade`.

* :mod:`.cli` -- ``python -m grader SUBMISSION``;
* :mod:`.notebook` -- ``from grader import check`` inside a notebook;
* :mod:`.classroom` -- ``python -m grader class``: a whole class, with :mod:`.roster`,
  :mod:`.processes` (one grading under a time limit; the gradings' fork server),
  :mod:`.scores` and :mod:`.classsummary`; around the gradings :mod:`.classrun` (the
  shard, the roster and the late policy before, the outputs after), with :mod:`.shards`,
  :mod:`.rosterfile`, :mod:`.lateness`, :mod:`.classreport`, :mod:`.similarity`,
  :mod:`.feedback` (each student's file to hand out) and :mod:`.sheets` (cells no
  spreadsheet runs);
* :mod:`.merge` -- ``python -m grader merge``: the shards of a class put back together;
* :mod:`.repos` -- ``python -m grader repos``: an assignment's repositories, all of them;
* :mod:`.classroom50` -- Classroom 50's autograder folder and the result.json it writes;
  :mod:`.classroom50_publish` -- a class run's grades into its gradebook (scores.json);
* :mod:`.export` -- ``python -m grader export``: a class's grades as a gradebook import;
* :mod:`.github` -- the student template repository, and the retired GitHub Classroom's outputs;
* :mod:`.gradescope` -- the Gradescope bundle and its run;
* :mod:`.release` -- ``exercises/`` written from ``solutions/``.
"""
