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
