"""``python -m specdec_course.cli``: the ``specdec-course`` command."""

import sys

from . import main

sys.exit(main())
