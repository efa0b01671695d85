"""Shared settings of the geometry tests."""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """OpenBLAS threads spin on the shared 2-core CI machine; one thread is much faster here."""
    with threadpool_limits(1):
        yield
