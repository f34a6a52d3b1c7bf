"""The generator fixture every Python test draws from."""

import numpy as np
import pytest

from helpers import SEED


@pytest.fixture
def rng(request):
    """A generator per test, from the run's seed and the test's name."""
    print(f"FA_TEST_SEED={SEED}")
    return np.random.default_rng([SEED, abs(hash(request.node.name)) % 2**32])
