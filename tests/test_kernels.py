"""The Triton kernels against the oracle: y, dx and dgamma over irregular shapes and three dtypes."""

import pytest
import torch

from rmsnorm_kernel import rmsnorm, rmsnorm_reference
from rmsnorm_kernel.tolerances import compare

from .conftest import make_inputs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NS = [1, 7, 255, 256, 257, 1000, 4096]
MS = [1, 17, 128]
SHAPES = [(m, n) for m in MS for n in NS] + [(2, 5, 257), (3, 4, 1, 64)]


def triton_and_reference(x, gamma, dy):
    """Forward and backward of both paths from the same leaves: ((y, dx, dgamma), (y, dx, dgamma))."""
    results = []
    for fn in (rmsnorm, rmsnorm_reference):
        xl = x.detach().clone().requires_grad_()
        gl = gamma.detach().clone().requires_grad_()
        y = fn(xl, gl)
        y.backward(dy)
        results.append((y.detach(), xl.grad, gl.grad))
    return results


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_matches_oracle_forward_dx_and_dgamma(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref), ("dgamma", dgamma, dgamma_ref)):
        assert got.dtype == want.dtype == dtype, name
        c = compare(got, want)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mixed_precision_pair_keeps_x_dtype_for_y_and_gamma_dtype_for_dgamma(x_dtype, device):
    x, gamma, dy = make_inputs((17, 257), x_dtype, device, gamma_dtype=torch.float32)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    assert y.dtype == dx.dtype == x_dtype
    assert dgamma.dtype == torch.float32
    assert compare(y, y_ref).ok
    assert compare(dx, dx_ref).ok
    # dgamma is accumulated in float32 from half inputs: judged at x's precision
    assert compare(dgamma, dgamma_ref, dtype=x_dtype).ok


def test_triton_matches_hand_worked_numbers(device):
    x = torch.tensor([[3.0, 4.0]], device=device, requires_grad=True)
    y = rmsnorm(x, torch.tensor([1.0, 1.0], device=device))
    torch.testing.assert_close(y.detach().cpu(), torch.tensor([[0.848528, 1.131371]]), atol=1e-6, rtol=0)
    y.backward(torch.tensor([[1.0, 2.0]], device=device))
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([[-0.090510, 0.067882]]), atol=1e-6, rtol=0)
    y2 = rmsnorm(x.detach(), torch.tensor([2.0, 0.5], device=device))
    torch.testing.assert_close(y2.cpu(), torch.tensor([[1.697056, 0.565685]]), atol=1e-6, rtol=0)


def test_backward_is_bitwise_deterministic(device):
    x, gamma, dy = make_inputs((128, 1000), torch.float32, device)
    first = triton_and_reference(x, gamma, dy)[0]
    second = triton_and_reference(x, gamma, dy)[0]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_backward_accepts_a_broadcast_upstream_gradient(device):
    x, gamma, _ = make_inputs((17, 33), torch.float32, device)
    xl = x.clone().requires_grad_()
    rmsnorm(xl, gamma).sum().backward()  # dy is an expanded (stride-0) tensor of ones
    xr = x.clone().requires_grad_()
    rmsnorm_reference(xr, gamma).sum().backward()
    assert compare(xl.grad, xr.grad).ok
