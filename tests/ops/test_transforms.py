"""``op.rmsnorm`` under torch.func (its autograd.Function's setup_context and vmap rules): grad, vjp,
jacrev and vmap give the reference's results within the declared tolerances, run the kernels (counted),
and leave the eager route as it was (one launch plan for both directions, double backward refused)."""

import pytest
import torch
from torch.func import grad, jacrev, vjp, vmap

from rmsnorm_kernel import call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import launchers, op
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs

DTYPES = [(torch.float32, None), (torch.bfloat16, torch.float32)]  # and mixed precision


def dtype_id(pair) -> str:
    return "-".join(str(d).removeprefix("torch.") for d in pair if d is not None)


def assert_close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert (a.shape, a.dtype) == (e.shape, e.dtype)
        result = compare(a, e)
        assert result.ok, result


def loss(norm):
    """A scalar of the norm's output that weighs every element differently (a plain sum of y would give
    dx = 0 in exact arithmetic for gamma = 1)."""
    return lambda x, gamma, dy: (norm(x, gamma).float() * dy.float()).sum()


def counted(fn):
    """(fn's result, the kernels' forward and backward calls it made)."""
    before = call_counts()
    result = fn()
    after = call_counts()
    return result, (after["forward"] - before["forward"], after["backward"] - before["backward"])


@pytest.mark.parametrize("dtypes", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)], ids=["x", "gamma", "both"])
def test_grad_gives_the_references_gradients(argnums, dtypes, device):
    x, gamma, dy = make_inputs((2, 3, 40), dtypes[0], device, gamma_dtype=dtypes[1])
    got, calls = counted(lambda: grad(loss(rmsnorm), argnums=argnums)(x, gamma, dy))
    want = grad(loss(rmsnorm_reference), argnums=argnums)(x, gamma, dy)
    assert_close(got if isinstance(argnums, tuple) else (got,), want if isinstance(argnums, tuple) else (want,))
    assert calls == (1, 1)  # the kernels ran, not a fallback


@pytest.mark.parametrize("dtypes", DTYPES, ids=dtype_id)
def test_vjp_gives_the_references_output_and_gradients(dtypes, device):
    x, gamma, dy = make_inputs((7, 300), dtypes[0], device, gamma_dtype=dtypes[1])
    y, pullback = vjp(rmsnorm, x, gamma)
    y_ref, pullback_ref = vjp(rmsnorm_reference, x, gamma)
    assert_close((y, *pullback(dy)), (y_ref, *pullback_ref(dy)))


@pytest.mark.parametrize("argnums", [0, 1], ids=["x", "gamma"])
def test_jacrev_gives_the_references_jacobian(argnums, device):
    x, gamma, _ = make_inputs((2, 6), torch.float32, device)
    got, calls = counted(lambda: jacrev(rmsnorm, argnums=argnums)(x, gamma))
    assert_close((got,), (jacrev(rmsnorm_reference, argnums=argnums)(x, gamma),))
    assert calls == (1, 12)  # one backward per row of the Jacobian (vmap over the 12 outputs' cotangents)


def test_double_backward_under_torch_func_is_refused_with_a_message(device):
    x, gamma, dy = make_inputs((3, 16), torch.float32, device)
    first = grad(loss(rmsnorm))
    with pytest.raises(NotImplementedError, match="double backward.*not implemented"):
        grad(lambda x: first(x, gamma, dy).sum())(x)


def test_torch_func_on_an_x_without_rows_gives_an_empty_dx_and_a_zero_dgamma(device):
    x = torch.randn(2, 0, 33, device=device)
    gamma = torch.linspace(0.5, 1.5, 33, device=device)
    (dx, dgamma), calls = counted(lambda: grad(lambda a, b: rmsnorm(a, b).sum(), argnums=(0, 1))(x, gamma))
    assert dx.shape == x.shape and torch.equal(dgamma, torch.zeros_like(gamma))
    assert calls == (0, 0)


# --------------------------------------------------------------------------------------------------
# vmap


@pytest.mark.parametrize("x_dim", [0, 1])
def test_vmap_over_x_is_one_launch_over_the_rows_of_every_sample(x_dim, device):
    x, gamma, _ = make_inputs((4, 5, 40), torch.float32, device)  # 4 samples of (5, 40)
    batched = x.movedim(0, x_dim).contiguous()  # the batch at x_dim of a contiguous tensor
    y, calls = counted(lambda: vmap(rmsnorm, in_dims=(x_dim, None))(batched, gamma))
    assert_close((y,), (rmsnorm_reference(x, gamma),))
    assert calls == (1, 0)


def test_vmap_over_a_batch_in_the_last_dimension_reads_a_copy_as_that_x_would(device):
    x, gamma, _ = make_inputs((3, 5, 40), torch.float32, device)
    batched = x.movedim(0, 2).contiguous()  # each sample's elements lie 3 apart
    y, calls = counted(lambda: vmap(rmsnorm, in_dims=(2, None))(batched, gamma))
    assert_close((y,), (rmsnorm_reference(x, gamma),))
    assert calls == (1, 0)


@pytest.mark.parametrize("x_batched", [True, False], ids=["x-batched", "x-shared"])
def test_vmap_over_gamma_is_one_launch_per_sample(x_batched, device):
    x, _, _ = make_inputs((3, 5, 40), torch.float32, device)
    gammas = 1.0 + 0.5 * torch.randn(3, 40, device=device)  # a weight per sample: an ensemble
    xs = x if x_batched else x[0]
    in_dims = (0 if x_batched else None, 0)
    y, calls = counted(lambda: vmap(rmsnorm, in_dims=in_dims)(xs, gammas))
    assert_close((y,), (vmap(rmsnorm_reference, in_dims=in_dims)(xs, gammas),))
    assert calls == (3, 0)


@pytest.mark.parametrize("gamma_batched", [False, True], ids=["gamma-shared", "gamma-batched"])
def test_per_sample_gradients_are_the_references(gamma_batched, device):
    """vmap(grad(...)): the gradient of each sample's loss on its own, dgamma included (a sum over that
    sample's rows only)."""
    x, gamma, dy = make_inputs((3, 5, 40), torch.float32, device)
    gammas = gamma + 0.1 * torch.randn(3, 40, device=device) if gamma_batched else gamma
    in_dims = (0, 0 if gamma_batched else None, 0)
    got = vmap(grad(loss(rmsnorm), argnums=(0, 1)), in_dims=in_dims)(x, gammas, dy)
    want = vmap(grad(loss(rmsnorm_reference), argnums=(0, 1)), in_dims=in_dims)(x, gammas, dy)
    assert got[1].shape == (3, 40)
    assert_close(got, want)


@pytest.mark.parametrize("gamma_batched", [False, True], ids=["gamma-shared", "gamma-batched"])
def test_grad_of_a_vmapped_loss_is_the_references(gamma_batched, device):
    x, gamma, dy = make_inputs((3, 5, 40), torch.float32, device)
    gammas = gamma + 0.1 * torch.randn(3, 40, device=device) if gamma_batched else gamma
    in_dims = (0, 0 if gamma_batched else None)

    def total(norm):
        return lambda x, g: (vmap(norm, in_dims=in_dims)(x, g) * dy).sum()

    got = grad(total(rmsnorm), argnums=(0, 1))(x, gammas)
    assert_close(got, grad(total(rmsnorm_reference), argnums=(0, 1))(x, gammas))


def test_autograd_through_vmap_gives_the_references_gradients(device):
    x, gamma, dy = make_inputs((3, 5, 40), torch.float32, device)
    xt, gt = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    vmap(rmsnorm, in_dims=(0, None))(xt, gt).backward(dy)
    rmsnorm_reference(xr, gr).backward(dy)
    assert_close((xt.grad, gt.grad), (xr.grad, gr.grad))


# --------------------------------------------------------------------------------------------------
# The eager route around these


def test_eager_forward_and_backward_share_one_launch_plan(device, monkeypatch):
    """The plan is made once, in the forward's call, and kept for the backward (ctx.plan)."""
    made = []
    for module in (op, launchers):
        real = module.plan_for
        monkeypatch.setattr(module, "plan_for", lambda *a, _real=real, **k: made.append(1) or _real(*a, **k))
    x, gamma, dy = make_inputs((6, 40), torch.float32, device)
    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    rmsnorm(xl, gl).backward(dy)
    assert len(made) == 1
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    rmsnorm_reference(xr, gr).backward(dy)
    assert_close((xl.grad, gl.grad), (xr.grad, gr.grad))


def test_vmap_of_the_residual_add_is_the_per_sample_result(device):
    x, gamma, _ = make_inputs((3, 4, 33), torch.float32, device)
    residual = make_inputs((3, 4, 33), torch.float32, device, seed=1)[0]
    y, h = torch.func.vmap(lambda a, b: rmsnorm(a, gamma, residual=b))(x, residual)
    for i in range(3):
        y_i, h_i = rmsnorm(x[i], gamma, residual=residual[i])
        assert torch.equal(y[i], y_i) and torch.equal(h[i], h_i)
    gammas = torch.stack([gamma, gamma * 2, gamma + 1])
    y, _ = torch.func.vmap(lambda a, b, g: rmsnorm(a, g, residual=b))(x, residual, gammas)
    assert torch.equal(y[1], rmsnorm(x[1], gamma * 2, residual=residual[1])[0])


def test_grad_of_the_residual_add_is_refused_in_one_line(device):
    x, gamma, _ = make_inputs((4, 33), torch.float32, device)
    residual = make_inputs((4, 33), torch.float32, device, seed=1)[0]
    with pytest.raises(NotImplementedError, match="torch.func transforms of the norm with a residual"):
        torch.func.grad(lambda a: rmsnorm(a, gamma, residual=residual)[0].sum())(x)
