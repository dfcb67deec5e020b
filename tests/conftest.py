import pytest
import torch

import rmsnorm_kernel  # noqa: F401  (chooses the backend before any kernel is decorated)
from rmsnorm_kernel.backend import kernel_device_type

DEVICE = kernel_device_type()


@pytest.fixture
def device() -> str:
    """Where the Triton path runs: 'cuda' on a GPU machine, 'cpu' under Triton's interpreter."""
    return DEVICE


def make_inputs(shape, dtype, device, gamma_dtype=None, seed=0):
    """Random x, a gamma that is not all ones, and a random upstream gradient dy."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    gamma = (1.0 + 0.5 * torch.randn(n, generator=g)).to(device=device, dtype=gamma_dtype or dtype)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    return x, gamma, dy
