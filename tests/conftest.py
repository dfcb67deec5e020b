"""Fixtures for every test, and the ``gpu`` marker's skip on machines without CUDA."""

import pytest
import torch

from tests.helpers import DEVICE


@pytest.fixture
def device() -> str:
    """Where the Triton path runs: 'cuda' on a GPU machine, 'cpu' under Triton's interpreter."""
    return DEVICE


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (a feature of the GPU, with no CPU counterpart)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def counting_calls():
    """Every test counts the Triton path's calls (``counters.counting``), so that any test can read them
    with ``call_counts()``; ``test_counters.py`` checks what happens with counting off."""
    from rmsnorm_kernel.ops.counters import counting

    with counting():
        yield
