"""Second implementations of a graded rule are out of the sandbox's reach (issue 43).

ex10's ``block_verify_row`` computes the block thresholds inline (uniforms of 2.0 and a
bisection read each one off it): it is withheld with ``block_thresholds``. Third-party
packages that implement a graded rule (transformers' ``_speculative_sampling`` answers
ex01's step) cannot be imported in any sandbox. Both are checked in a real sandboxed kernel.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
from graded_class import MODE

from specdec_grader.judge import sandbox, withheld
from specdec_grader.judge.core import public_implementations
from specdec_grader.judge.session import Session

pytestmark = pytest.mark.skipif(sandbox.plan(MODE).mode != "bwrap", reason="needs bubblewrap")

# A package the kernel never imports, installed wherever the tests run: it stands in for
# transformers where the [hf] extra is not installed.
STAND_IN = "nbval"


def _kernel(exercise: str) -> Session:
    s = Session(
        sandbox.plan(MODE),
        tag=f"specdec-reach-{time.monotonic_ns()}",
        memory_mb=3000,
        limits={"as": 3000 * 2**20, "cpu": 600, "nproc": 256, "fsize": 2**24, "nofile": 256},
        notebook_name="reach.ipynb",
        notebook_text="",
        withhold=(exercise, public_implementations(exercise)),
    )
    s.start()
    return s


def test_the_named_second_implementations_are_withheld():
    assert "specdec_course.block_verifier.block_verify_row" in public_implementations("ex10")
    assert set(withheld.HIDDEN_PACKAGES) >= {"transformers", "vllm", "flashinfer"}


def test_block_verify_row_and_hidden_packages_are_unreachable_in_the_sandbox(monkeypatch):
    assert importlib.util.find_spec(STAND_IN) is not None
    monkeypatch.setitem(withheld.HIDDEN_PACKAGES, STAND_IN, "a stand-in for transformers")
    s = _kernel("ex10")
    try:
        row = s.run_cell(
            "import torch\n"
            "from specdec_course.block_verifier import block_verify_row\n"
            "p = torch.full((3, 4), 0.25); q = torch.full((2, 4), 0.25)\n"
            "block_verify_row(torch.tensor([0, 1]), q, p, [2.0, 2.0], torch.ones(4))\n",
            30.0,
        )
        assert row["error"]["type"] == withheld.ERROR, row
        assert withheld.named_in(row["error"])[0].endswith("block_verify_row")
        for name in (STAND_IN, "transformers", "transformers.generation.utils"):
            got = s.run_cell(f"import {name}\n", 30.0)
            assert got["error"] and got["error"]["type"] in (
                "ImportError",
                "ModuleNotFoundError",
            ), (name, got)
        # Nor can its files be read.
        spec = importlib.util.find_spec(STAND_IN)
        folder = sandbox.mounts.inside(list(spec.submodule_search_locations)[0])  # its path there
        listing = s.run_cell(
            f"import os\nassert os.listdir({folder!r}) == ['__init__.py'], os.listdir({folder!r})",
            30.0,
        )
        assert listing["ok"], listing
    finally:
        s.close()
