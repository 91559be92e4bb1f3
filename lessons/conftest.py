"""Lesson 10 meets Hugging Face transformers, the optional extra ``[hf]``: without it the
lesson's cells are skipped, with the reason, instead of failing on the import. CI
(``.ci/run``) installs the extra, so there the lesson runs under strict nbval."""

import importlib.util
from pathlib import Path

import pytest

_NEEDS_HF = ("10_from_scratch_to_transformers.ipynb",)


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("transformers") is not None:
        return
    skip = pytest.mark.skip(reason="needs the [hf] extra: pip install -e '.[hf]' (transformers)")
    for item in items:
        if Path(str(item.fspath)).name in _NEEDS_HF:
            item.add_marker(skip)
