"""Where the repository keeps its data: corpus, checkpoints and stored GPU results.

The package is installed editable from the repository (``pip install -e .``), so ``data/``
sits beside the package. ``SPECDEC_DATA`` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("SPECDEC_DATA", REPO_ROOT / "data"))


def checkpoints_dir() -> Path:
    return data_dir() / "checkpoints"


def results_dir() -> Path:
    return data_dir() / "results"


def scratch_dir() -> Path:
    """Where ``specdec-course bench`` writes unless given ``--record`` (git-ignored):
    ``bench-results/`` in the repository, or ``SPECDEC_SCRATCH``."""
    return Path(os.environ.get("SPECDEC_SCRATCH", REPO_ROOT / "bench-results"))
