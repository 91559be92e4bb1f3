"""The kernel side of the batch grader: what the sandbox may import.

The agent that runs a submission's cells and calls its functions (:mod:`.agent`, started as
``python -I -m specdec_grader.student_side``), the channel format (:mod:`.wire`), the
plain result types both sides share (:mod:`.results`, :mod:`.errors`) and the probes that
launch a student's object where it lives (:mod:`.probes`). Nothing here is a reference, an
exact law or a case generator: those are in :mod:`specdec_grader.judge`, which the
sandbox never mounts, and nothing here imports it.
"""

# Set by the batch grader in kernels that run without bubblewrap (where the judge side can
# be imported): the notebook's own `check(...)` cells then print one line instead of grading.
# In the sandbox the judge side is absent, which says the same.
BATCH_ENV = "SPECDEC_COURSE_BATCH"

# Set by the batch grader when it runs as root without a cgroup: the uid the kernel takes
# before it reads any request (RLIMIT_NPROC binds no root process, and a uid of its own keeps
# one kernel's processes from counting against another's).
UID_ENV = "SPECDEC_KERNEL_UID"

__all__ = ["BATCH_ENV", "UID_ENV", "drop_root"]


def drop_root() -> None:
    """Become the uid that ``SPECDEC_KERNEL_UID`` names (its group too, no other group), for
    good: real, effective and saved ids, which also clears every capability. Ends the
    process (exit 70) if it cannot; does nothing without the variable."""
    import os

    value = os.environ.pop(UID_ENV, None)
    if value is None:
        return
    try:
        uid = int(value)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        ok = uid > 0 and os.getresuid() == (uid, uid, uid) and os.getgroups() == []
    except (ValueError, OSError):
        ok = False
    if not ok:
        os._exit(70)
