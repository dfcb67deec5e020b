"""Inputs at the edges: non-finite rows, extreme magnitudes, the opt-in fallback, double backward.
(x without rows: tests/ops/test_op.py and test_contract.py.)"""

import logging

import pytest
import torch

from rmsnorm_kernel import ContractError, RMSNorm, call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import launch
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_value_gives_the_reference_result_on_its_row_and_spares_the_others(bad, device):
    x, gamma, _ = make_inputs((5, 257), torch.float32, device)
    x[2, 100] = bad
    y, ref = rmsnorm(x, gamma), rmsnorm_reference(x, gamma)
    assert compare(y, ref).ok  # NaN where the reference has NaN, the same values elsewhere
    assert torch.isnan(y[2]).any()
    clean = torch.tensor([0, 1, 3, 4])
    assert torch.isfinite(y[clean]).all()
    assert torch.equal(y[clean], rmsnorm(x[clean].contiguous(), gamma))  # the other rows are untouched


@pytest.mark.parametrize("n, branch", [(257, "whole_rows"), (8704, "reread_rows"), (8193, "looped")])
def test_a_nan_in_x_gives_the_reference_gradients_on_its_row_and_spares_the_others(n, branch, device):
    x, gamma, dy = make_inputs((3, n), torch.float32, device)
    assert launch.plan_for(x, gamma).bwd_branch == branch
    x[1, 100] = float("nan")
    xl, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    rmsnorm(xl, gamma).backward(dy)
    rmsnorm_reference(xr, gamma).backward(dy)
    assert compare(xl.grad, xr.grad).ok  # NaN where the reference has NaN, the same values elsewhere
    assert torch.isnan(xl.grad[1]).all() and torch.isfinite(xl.grad[[0, 2]]).all()


def test_non_finite_upstream_gradient_stays_on_its_row(device):
    x, gamma, dy = make_inputs((4, 64), torch.float32, device)
    dy[1, 3] = float("nan")
    xl = x.clone().requires_grad_()
    rmsnorm(xl, gamma).backward(dy)
    assert torch.isnan(xl.grad[1]).any()
    assert torch.isfinite(xl.grad[[0, 2, 3]]).all()


@pytest.mark.parametrize(
    "dtype,value,n",
    [
        (torch.float32, 1e-20, 257),  # eps dominates: y = x / sqrt(eps) * gamma
        (torch.float32, 1e18, 257),  # sum of squares 2.6e38, just inside float32
        (torch.float32, 0.0, 257),  # a row of zeros gives zeros
        (torch.float16, 60000.0, 4096),  # near float16's maximum: squares only exist in float32
        (torch.float16, 6e-8, 1000),  # float16 subnormals
        (torch.bfloat16, 1e18, 257),  # bfloat16 has float32's range
        (torch.bfloat16, 1e-30, 257),
    ],
)
def test_extreme_magnitudes_match_the_reference(dtype, value, n, device):
    g = torch.Generator().manual_seed(3)
    signs = torch.where(torch.rand(3, n, generator=g) < 0.5, -1.0, 1.0)
    x = (signs * value * (1 + torch.rand(3, n, generator=g) * 0.05)).to(device=device, dtype=dtype)
    gamma = (1 + 0.5 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    dy = torch.randn(3, n, generator=g).to(device=device, dtype=dtype)
    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    y = rmsnorm(xl, gl)
    y.backward(dy)
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    ref = rmsnorm_reference(xr, gr)
    ref.backward(dy)
    assert torch.isfinite(y).all()
    if value >= 1:
        assert y.abs().max() > 0.1  # a real answer, not the zeros of an overflowed sum of squares
    for name, got, want in (("y", y, ref), ("dx", xl.grad, xr.grad), ("dgamma", gl.grad, gr.grad)):
        c = compare(got, want)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}"


def test_float32_sum_of_squares_overflow_is_the_documented_limit(device):
    """Rows whose sum of squares passes float32's maximum (3.4e38) give r = 0, as the reference does."""
    x = torch.full((1, 1024), 1e18, device=device)  # 1024 * 1e36 = 1e39
    gamma = torch.ones(1024, device=device)
    y, ref = rmsnorm(x, gamma), rmsnorm_reference(x, gamma)
    assert torch.equal(y, ref)
    assert torch.equal(y, torch.zeros_like(y))


#: Rows longer than the kernels take: refused by the contract, computed by the reference.
TOO_LONG = MAX_N + 1


def test_fallback_is_off_by_default(device):
    norm = RMSNorm(TOO_LONG).to(device)
    with pytest.raises(ContractError, match=f"x has rows of N = {TOO_LONG} elements"):
        norm(torch.randn(2, TOO_LONG, device=device))
    assert norm.fallback_count == 0


def test_fallback_sends_refused_inputs_to_the_reference_counts_them_and_logs_once(device, caplog):
    norm = RMSNorm(TOO_LONG, eps=1e-6, fallback="reference").to(device)
    x = torch.randn(3, TOO_LONG, device=device)
    before = call_counts()
    with caplog.at_level(logging.WARNING, logger="rmsnorm_kernel"):
        y = norm(x)  # rows too long: refused
        y_again = norm(x * 2)
    assert norm.fallback_count == 2
    assert call_counts() == before  # no Triton call for refused inputs
    assert torch.equal(y, rmsnorm_reference(x, norm.weight, 1e-6))
    assert torch.equal(y_again, rmsnorm_reference(x * 2, norm.weight, 1e-6))
    messages = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(messages) == 1 and f"N = {TOO_LONG}" in messages[0] and "accepted:" in messages[0]
    # an input the contract accepts still takes the Triton path
    RMSNorm(8, fallback="reference").to(device)(torch.randn(3, 8, device=device))
    assert call_counts()["forward"] == before["forward"] + 1
    assert norm.fallback_count == 2


def test_fallback_leaves_an_x_without_rows_on_the_triton_path(device, caplog):
    """An x without rows is no longer refused, so the fallback has nothing to catch: no count, no warning."""
    norm = RMSNorm(8, fallback="reference").to(device)
    with caplog.at_level(logging.WARNING, logger="rmsnorm_kernel"):
        y = norm(torch.randn(0, 8, device=device))
    assert y.shape == (0, 8) and norm.fallback_count == 0
    assert not [r for r in caplog.records if "fallback" in r.getMessage()]


def test_fallback_covers_rows_longer_than_the_kernels_take(device):
    n = MAX_N + 1
    norm = RMSNorm(n, eps=1e-6, fallback="reference").to(device)
    x = torch.randn(1, n, device=device)
    assert compare(norm(x), rmsnorm_reference(x, norm.weight)).ok
    assert norm.fallback_count == 1


def test_unknown_fallback_is_refused():
    with pytest.raises(ValueError, match=r"fallback is 'triton'; accepted: None or 'reference'"):
        RMSNorm(8, fallback="triton")


@pytest.mark.parametrize("route", ["rmsnorm", "op"])
def test_double_backward_is_refused_with_a_message(route, device):
    x, gamma, _ = make_inputs((3, 16), torch.float32, device)
    x.requires_grad_()
    fn = rmsnorm if route == "rmsnorm" else (lambda a, b: torch.ops.rmsnorm_kernel.rmsnorm(a, b, 1e-6))
    (gx,) = torch.autograd.grad(fn(x, gamma).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad  # not silently detached
    with pytest.raises(NotImplementedError, match="double backward.*not implemented"):
        gx.pow(2).sum().backward()


def test_reference_passes_gradgradcheck_for_those_who_need_second_order():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    gamma = (1 + 0.5 * torch.randn(6, dtype=torch.float64, generator=g)).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda a, b: rmsnorm_reference(a, b), (x, gamma))


def test_backward_gives_the_same_bits_call_after_call(device):
    """No atomics in the dgamma reduction: the same bits every call (a shape with dgamma partials)."""
    shape, calls = ((4096, 4096), 100) if device == "cuda" else ((130, 512), 10)
    x, gamma, dy = make_inputs(shape, torch.float32, device)
    first = None
    for _ in range(calls):
        xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        rmsnorm(xl, gl).backward(dy)
        if first is None:
            first = (xl.grad.clone(), gl.grad.clone())
        else:
            assert torch.equal(xl.grad, first[0]) and torch.equal(gl.grad, first[1])
