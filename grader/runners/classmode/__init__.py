"""Class mode: a whole class graded, and its outputs.

* :mod:`.classroom` -- ``python -m grader class``: with :mod:`.roster`, :mod:`.processes`
  (one grading under a time limit; the gradings' fork server), :mod:`.scores` and
  :mod:`.classsummary`; around the gradings :mod:`.classrun` (the shard, the roster and the
  late policy before, the outputs after), with :mod:`.shards`, :mod:`.rosterfile`,
  :mod:`.lateness`, :mod:`.classreport`, :mod:`.similarity`, :mod:`.feedback` (each student's
  file to hand out) and :mod:`.sheets` (cells no spreadsheet runs);
* :mod:`.merge` -- ``python -m grader merge``: the shards of a class put back together.
"""
