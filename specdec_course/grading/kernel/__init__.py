"""The kernel side of the batch grader: what the sandbox may import.

The agent that runs a submission's cells and calls its functions (:mod:`.agent`, started as
``python -I -m specdec_course.grading.kernel``), the channel format (:mod:`.wire`), the
plain result types both sides share (:mod:`.results`, :mod:`.errors`) and the probes that
launch a student's object where it lives (:mod:`.probes`). Nothing here is a reference, an
exact law or a case generator: those are in :mod:`specdec_course.grading.judge`, which the
sandbox never mounts, and nothing here imports it.
"""

# Set by the batch grader in kernels that run without bubblewrap (where the judge side can
# be imported): the notebook's own `check(...)` cells then print one line instead of grading.
# In the sandbox the judge side is absent, which says the same.
BATCH_ENV = "SPECDEC_COURSE_BATCH"

__all__ = ["BATCH_ENV"]
