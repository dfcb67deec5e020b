"""The oracle: hand-worked numbers, float64 gradcheck, and the explicit backward against autograd."""

import pytest
import torch

from rmsnorm_kernel import manual_backward, oracle, rmsnorm_reference
from rmsnorm_kernel.ops.tolerances import compare

# Triton tutorial's hand-worked example: x = [3, 4], mean(x^2) = 12.5, r = 1/sqrt(12.5 + 1e-6).
HAND_ATOL = 1e-6


def test_reference_matches_hand_worked_forward():
    x = torch.tensor([[3.0, 4.0]])
    y = rmsnorm_reference(x, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(y, torch.tensor([[0.848528, 1.131371]]), atol=HAND_ATOL, rtol=0)
    y = rmsnorm_reference(x, torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(y, torch.tensor([[1.697056, 0.565685]]), atol=HAND_ATOL, rtol=0)


def test_manual_backward_matches_hand_worked_dx():
    dx, dgamma = manual_backward(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 2.0]]))
    torch.testing.assert_close(dx, torch.tensor([[-0.090510, 0.067882]]), atol=HAND_ATOL, rtol=0)
    # dgamma = dy * x * r = [1 * 3, 2 * 4] / sqrt(12.5)
    torch.testing.assert_close(dgamma, torch.tensor([0.848528, 2.262742]), atol=HAND_ATOL, rtol=0)


def test_reference_passes_float64_gradcheck():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, generator=g, requires_grad=True)
    gamma = (1 + 0.5 * torch.randn(7, dtype=torch.float64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rmsnorm_reference(a, b), (x, gamma))


@pytest.mark.parametrize("shape", [(1, 1), (17, 7), (4, 257), (2, 3, 33)])
def test_manual_backward_matches_autograd_of_reference_float64(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
    gamma = (1 + 0.5 * torch.randn(shape[-1], dtype=torch.float64, generator=g)).requires_grad_()
    dy = torch.randn(shape, dtype=torch.float64, generator=g)
    rmsnorm_reference(x, gamma).backward(dy)
    dx, dgamma = manual_backward(x.detach(), gamma.detach(), dy)
    assert compare(dx, x.grad).ok, compare(dx, x.grad)
    assert compare(dgamma, gamma.grad).ok, compare(dgamma, gamma.grad)


def test_dgamma_is_a_sum_over_rows_not_a_mean():
    x = torch.ones(4, 3, dtype=torch.float64)
    dy = torch.ones(4, 3, dtype=torch.float64)
    _, dgamma = manual_backward(x, torch.ones(3, dtype=torch.float64), dy)
    # each row contributes dy * x * r = 1 / sqrt(1 + eps); four rows sum to about 4
    torch.testing.assert_close(dgamma, torch.full((3,), 4.0, dtype=torch.float64), atol=1e-5, rtol=0)


def test_reference_computes_half_inputs_in_float32_and_returns_their_dtype():
    x = torch.full((1, 4), 300.0, dtype=torch.float16)  # 300^2 overflows float16, not float32
    y = rmsnorm_reference(x, torch.ones(4, dtype=torch.float16))
    assert y.dtype == torch.float16
    assert torch.isfinite(y).all()
    assert compare(y, torch.ones(1, 4, dtype=torch.float16)).ok


def test_oracle_gives_hand_worked_y_dx_dgamma_in_the_inputs_dtypes():
    x, gamma, dy = torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 2.0]])
    y, dx, dgamma = oracle(x, gamma, dy)
    assert y.dtype == dx.dtype == dgamma.dtype == torch.float32
    torch.testing.assert_close(y, torch.tensor([[0.848528, 1.131371]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(dx, torch.tensor([[-0.090510, 0.067882]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(dgamma, torch.tensor([0.848528, 2.262742]), atol=1e-6, rtol=0)
    _, _, dgamma_mixed = oracle(x.half(), gamma, dy.half())
    assert dgamma_mixed.dtype == torch.float32  # gamma's dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_manual_backward_and_oracle_of_an_x_without_rows_give_empty_dx_and_zero_dgamma(dtype):
    x = torch.randn(2, 0, 5, dtype=dtype)
    gamma = torch.linspace(0.5, 1.5, 5, dtype=dtype)
    dx, dgamma = manual_backward(x, gamma, x)
    assert dx.shape == x.shape and torch.equal(dgamma, torch.zeros(5, dtype=dtype))
    y, dx, dgamma = oracle(x, gamma, x)
    assert y.shape == dx.shape == x.shape and (y.dtype, dgamma.dtype) == (dtype, dtype)
    assert torch.equal(dgamma, torch.zeros(5, dtype=dtype))


@pytest.mark.parametrize("shape", [(1, 1), (17, 7), (4, 257)])
def test_silu_backward_matches_autograd_of_torchs_silu_after_the_reference_float64(shape):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
    gamma = (1 + 0.5 * torch.randn(shape[-1], dtype=torch.float64, generator=g)).requires_grad_()
    dz = torch.randn(shape, dtype=torch.float64, generator=g)
    z = torch.nn.functional.silu(rmsnorm_reference(x, gamma))  # torch's SiLU, not this module's formula
    z.backward(dz)
    assert compare(rmsnorm_reference(x.detach(), gamma.detach(), activation="silu"), z.detach()).ok
    dx, dgamma = manual_backward(x.detach(), gamma.detach(), dz, activation="silu")
    assert compare(dx, x.grad).ok, compare(dx, x.grad)
    assert compare(dgamma, gamma.grad).ok, compare(dgamma, gamma.grad)


def test_silu_gives_hand_worked_numbers():
    # y = [0.848528, 1.131371] (the example above); silu(y) = y / (1 + exp(-y))
    z = rmsnorm_reference(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 1.0]), activation="silu")
    torch.testing.assert_close(z, torch.tensor([[0.594189, 0.855420]]), atol=HAND_ATOL, rtol=0)


@pytest.mark.parametrize("kwargs", [{"mode": "Gemma"}, {"mode": "bad"}, {"activation": "gelu"}])
def test_the_oracle_refuses_a_mode_or_activation_it_does_not_define(kwargs):
    x, gamma = torch.ones(2, 4), torch.ones(4)
    for call in (
        lambda: rmsnorm_reference(x, gamma, **kwargs),
        lambda: manual_backward(x, gamma, x, **kwargs),
        lambda: oracle(x, gamma, x, **kwargs),
    ):
        with pytest.raises(ValueError, match=r"reference: (mode|activation) is '\w+'; accepted: "):
            call()
