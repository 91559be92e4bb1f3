"""``python -I -m specdec_grader.student_side``: serve the judge (see :mod:`.agent`)."""

from . import drop_root

drop_root()  # first, before anything else is imported or read (see UID_ENV)

from .agent import main  # noqa: E402

if __name__ == "__main__":
    main()
