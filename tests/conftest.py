import pytest

import specdec_course


@pytest.fixture(autouse=True)
def _repeatable():
    # Same seed and thread count as the notebooks: results do not depend on test order.
    specdec_course.notebook_setup(seed=0, threads=1)
    yield
