"""``python -m specdec_grader``: the ``specdec-grader`` command (see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
