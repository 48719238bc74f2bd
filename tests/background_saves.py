"""A fixture for tests that start background checkpoint saves: after each test, whatever save it
left running is waited for (a failed one is fine there: the test has already judged it), so no
writer thread outlives its test and writes into the next test's files."""

import pytest

from dualemb.core.checkpoint import _background
from dualemb.core.checkpoint._manifest import CheckpointError


@pytest.fixture(autouse=True)
def no_save_left_running():
    yield
    try:
        _background.wait_running()
    except CheckpointError:
        pass
