"""Running untrusted code: everything between the engine and a student's function.

Listed from the ground up: each module imports only modules listed above it.

* :mod:`.limits` -- what a worker is given: time and memory limits, environment, outcome names;
* :mod:`.status` -- the status pipe's lines, read with bounded lengths and numbers;
* :mod:`.procs` -- processes read from ``/proc``: descendants, sessions, users; killing them;
* :mod:`.confine` -- hiding the course, other submissions and the seed (a mount namespace);
* :mod:`.integrity` -- the grader's own files, snapshot and verified after student code ran;
* :mod:`.channel` -- the worker's answers, encoded so that no pickle from student code is loaded;
* :mod:`.execute` -- one call of a student's function, with its time limit;
* :mod:`.deferred` -- stand-ins for torch's heaviest modules, until student code needs them;
* :mod:`.users` -- the unprivileged user student code runs as when the grader is root;
* :mod:`.worker` -- the child: loads the submission, runs the calls, reports;
* :mod:`.forkserver` -- the zygote: workers forked with torch already imported;
* :mod:`.supervisor` -- the parent's side: start, feed, watch and replace workers.
"""
