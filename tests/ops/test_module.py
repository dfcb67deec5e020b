"""The RMSNorm module: every path agrees, and the choice of path never changes parameters or RNG use."""

import pytest
import torch

from rmsnorm_kernel import RMSNorm
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.tolerances import compare
from tests.ops.helpers import NO_ROWS_DTYPES, assert_empty_y_empty_dx_zero_dgamma, dtype_pair_id


def test_weight_starts_at_ones_and_is_learnable():
    m = RMSNorm(257)
    assert m.weight.requires_grad
    assert torch.equal(m.weight, torch.ones(257))


def test_impl_choice_does_not_touch_the_random_generator():
    after = {}
    for impl in IMPLS:
        torch.manual_seed(7)
        RMSNorm(64, impl=impl)
        after[impl] = torch.rand(4)
    assert all(torch.equal(a, after["reference"]) for a in after.values())


def test_every_impl_computes_the_reference_output_and_gradients(device):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 257, device=device)
    outs = {}
    for impl in IMPLS:
        m = RMSNorm(257, impl=impl).to(device)
        with torch.no_grad():
            m.weight.copy_(torch.linspace(0.5, 1.5, 257))
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.pow(2).sum().backward()
        outs[impl] = (y.detach(), xi.grad, m.weight.grad)
    for impl in ("triton", "native"):
        for got, want in zip(outs[impl], outs["reference"]):
            assert compare(got, want).ok, impl


@pytest.mark.parametrize("dtypes", NO_ROWS_DTYPES, ids=dtype_pair_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_gives_an_empty_output_and_a_zero_weight_grad_for_an_x_without_rows(impl, dtypes, device):
    x_dtype, weight_dtype = dtypes
    m = RMSNorm(33, impl=impl, dtype=weight_dtype).to(device)
    x = torch.randn(0, 33, device=device).to(x_dtype).requires_grad_()
    y = m(x)
    y.sum().backward()
    assert_empty_y_empty_dx_zero_dgamma(y, x, m.weight)


def test_unknown_impl_is_refused_with_the_accepted_values():
    with pytest.raises(ValueError, match=r"impl is 'cuda'.*'triton', 'reference', 'native'"):
        RMSNorm(8, impl="cuda")


@pytest.mark.parametrize("shape", [(4, 4), 0, ()])
def test_normalized_shape_must_be_one_positive_int(shape):
    with pytest.raises(ValueError, match="normalized_shape"):
        RMSNorm(shape)
