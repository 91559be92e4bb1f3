"""The judge side of the batch grader: never mounted in the sandbox (not even as files).

The check registry and runner (:mod:`.core`), the exercises' checks with their references
and exact laws (``exNN``), case generation (:mod:`.context`), the sessions that talk to a
kernel (:mod:`.session`, :mod:`.remote`, :mod:`.exposure`), the sandbox (:mod:`.sandbox`),
one submission's grading (:mod:`.submission`) and the batch runner (:mod:`.runner`,
:mod:`.worker`, :mod:`.cluster`, :mod:`.batch`, :mod:`.reports`). It imports the kernel side
(:mod:`specdec_grader.student_side`) for the wire format and the shared result types;
nothing there imports this package.
"""
