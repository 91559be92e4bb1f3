import pytest

import specdec_course
from specdec_course import data as D
from specdec_course.model import load_pretrained


@pytest.fixture(autouse=True)
def _repeatable():
    # Same seed and thread count as the notebooks: results do not depend on test order.
    specdec_course.notebook_setup(seed=0, threads=1)
    yield


# Shared by the test modules that need them (one load per module, as each module had).
@pytest.fixture(scope="module")
def target():
    """The shipped 4-layer target model, in eval mode."""
    return load_pretrained("target")


@pytest.fixture(scope="module")
def split():
    """The corpus's ``(train, val)`` ids."""
    return D.corpus_split()


@pytest.fixture(scope="module")
def val_prompts(split):
    """Three 32-character validation prompts (the Medusa tests'; test_decoding has its own)."""
    _, val = split
    return [val[i : i + 32] for i in (0, 7000, 31000)]


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory):
    """The class of ``tests/graded_class.py``, graded once per session by the real
    ``specdec-grader``; xdist's workers share it (the second reads the first's results)."""
    import graded_class as gc

    return gc.load(gc.shared_dir(tmp_path_factory))


# The test files that read the graded class (``graded_class.PARTS``) run on one xdist worker,
# as one work unit. Under plain ``--dist loadfile`` two workers took two of them: one graded
# the class (about 220 s on two cores) while the other waited on its lock (about 170 s idle);
# now the other worker runs the rest of the suite meanwhile.
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", None) != "loadfile":
        return None
    import graded_class
    from xdist.scheduler import LoadFileScheduling

    parts = {f"{part}.py" for part in graded_class.PARTS}

    class _OneGradedClassUnit(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return "graded class" if scope.rsplit("/", 1)[-1] in parts else scope

    return _OneGradedClassUnit(config, log)
