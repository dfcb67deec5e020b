"""The seed peer: the one-program-per-row kernel a newcomer writes, right forward and backward."""

import pytest
import torch

from benchmarks.impls import EPS, FWD_BWD, make_call, make_impl
from rmsnorm_kernel.ops.reference import oracle
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs


@pytest.mark.parametrize("shape", [(3, 33), (2, 3, 256)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_seed_kernel_matches_the_oracle_forward_and_backward(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    y_want, dx_want, dgamma_want = oracle(x, gamma, dy, EPS)
    step = make_call(FWD_BWD, make_impl("seed", device), x, gamma, dy)
    y, dx, dgamma = step()
    assert compare(y, y_want).ok and compare(dx, dx_want).ok and compare(dgamma, dgamma_want).ok


def test_the_seed_kernel_refuses_rows_wider_than_its_registers_take(device):
    x = torch.zeros(1, 65537, device=device)
    with pytest.raises(ValueError, match="N = 65537 elements; accepted: N <= 65536"):
        make_impl("seed", device)(x, torch.ones(65537, device=device))
