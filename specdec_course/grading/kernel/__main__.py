"""``python -I -m specdec_course.grading.kernel``: serve the judge (see :mod:`.agent`)."""

from .agent import main

if __name__ == "__main__":
    main()
