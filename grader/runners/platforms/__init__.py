"""The platforms a class's work comes from and its grades go to.

* :mod:`.classroom50` -- Classroom 50's autograder folder and the result.json it writes;
  :mod:`.classroom50_publish` -- a class run's grades into its gradebook (scores.json);
* :mod:`.gradescope` -- the Gradescope bundle and its run;
* :mod:`.github` -- the student template repository, and the retired GitHub Classroom's outputs;
* :mod:`.export` -- ``python -m grader export``: a class's grades as a gradebook import;
* :mod:`.repos` -- ``python -m grader repos``: an assignment's repositories, all of them.
"""
