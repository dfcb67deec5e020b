"""The RMSNorm module: every path agrees with ``torch.nn.RMSNorm`` (outputs, gradients, arguments, state
dict, repr), and the choice of path never changes parameters or RNG use."""

import re

import pytest
import torch

from rmsnorm_kernel import RMSNorm, call_counts, oracle
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.module import default_eps
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs
from tests.ops.helpers import NO_ROWS_DTYPES, assert_empty_y_empty_dx_zero_dgamma, dtype_pair_id

#: x is drawn at this scale, so that its mean square (about 1e-6) is of the order of the eps values in
#: play: an eps other than torch's (1e-6 for float32's 1.2e-7, bfloat16's 7.8e-3 for float32's) moves
#: the output far past the tolerances.
SMALL = 1e-3

#: (normalized_shape, x shape, dtype, elementwise_affine, fallback), each against torch.nn.RMSNorm with eps=None.
TORCH_CASES = {
    "default-float32": (64, (4, 3, 64), torch.float32, True, None),
    "default-bfloat16": (64, (4, 3, 64), torch.bfloat16, True, None),
    "default-float64": (64, (4, 64), torch.float64, True, None),
    "2d-shape": ((4, 16), (3, 4, 16), torch.float32, True, None),
    "no-affine": (64, (4, 3, 64), torch.float32, False, None),
    "no-affine-2d-bfloat16": ((4, 16), (3, 4, 16), torch.bfloat16, False, None),
}


def _set_weight(*modules):
    """The same weight, not all ones (a path that ignored it would fail), in every module that has one."""
    for m in modules:
        if m.weight is not None:
            with torch.no_grad():
                m.weight.copy_(torch.linspace(0.5, 1.5, m.weight.numel()).reshape(m.weight.shape))


def _run(module, x, dy):
    """(y, dx, dweight or None) of ``module`` on ``x`` with upstream gradient ``dy``."""
    xi = x.clone().requires_grad_()
    y = module(xi)
    y.backward(dy)
    return y.detach(), xi.grad, None if module.weight is None else module.weight.grad


@pytest.mark.parametrize("case", TORCH_CASES)
@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_matches_torch_rmsnorm_output_and_gradients(impl, case, device):
    shape, x_shape, dtype, affine, fallback = TORCH_CASES[case]
    torch.manual_seed(0)
    ours = RMSNorm(shape, elementwise_affine=affine, device=device, dtype=dtype, impl=impl, fallback=fallback)
    theirs = torch.nn.RMSNorm(shape, elementwise_affine=affine, device=device, dtype=dtype)
    assert ours.eps is None and theirs.eps is None
    _set_weight(ours, theirs)
    x = (SMALL * torch.randn(x_shape, device=device)).to(dtype)
    dy = torch.randn(x_shape, device=device).to(dtype)
    got, want = _run(ours, x, dy), _run(theirs, x, dy)
    for name, g, w in zip(("y", "dx", "dweight"), got, want):
        if w is None:
            assert g is None, name
            continue
        c = compare(g, w)
        assert c.ok, f"{impl} {case} {name}: max_abs {c.max_abs:.3g}, {c.worst_over_tol:.3g} x the tolerance"


def test_default_eps_is_torchs_machine_epsilon_of_the_computation_type():
    f32, f64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps
    assert [default_eps(d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)] == [
        f32,
        f32,
        f32,
        f64,
    ]


def test_positional_arguments_mean_what_torchs_mean(device):
    ours, theirs = RMSNorm(64, 1e-5, True), torch.nn.RMSNorm(64, 1e-5, True)
    assert (ours.normalized_shape, ours.eps, ours.elementwise_affine) == (
        theirs.normalized_shape,
        theirs.eps,
        theirs.elementwise_affine,
    )
    ours, theirs = ours.to(device), theirs.to(device)
    _set_weight(ours, theirs)
    torch.manual_seed(0)
    x = SMALL * torch.randn(3, 64, device=device)  # eps = 1e-5 dominates the mean square: it must be the one used
    assert compare(ours(x), theirs(x)).ok

    full = RMSNorm((2, 8), None, False, device, torch.float64)
    assert (full.normalized_shape, full.eps, full.weight) == ((2, 8), None, None)
    assert RMSNorm(8, None, True, device, torch.bfloat16).weight.dtype == torch.bfloat16


def test_impl_and_fallback_are_keyword_only():
    with pytest.raises(TypeError, match="positional argument"):
        RMSNorm(64, 1e-5, True, None, None, "reference")


def test_weight_starts_at_ones_and_is_learnable():
    m = RMSNorm(257)
    assert m.weight.requires_grad
    assert torch.equal(m.weight, torch.ones(257))
    assert RMSNorm((2, 3)).weight.shape == (2, 3)


def test_reset_parameters_sets_the_weight_back_to_ones():
    m = RMSNorm((2, 3))
    _set_weight(m)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(2, 3))
    RMSNorm(4, elementwise_affine=False).reset_parameters()  # nothing to reset, nothing raised


def test_without_elementwise_affine_there_is_no_parameter():
    m = RMSNorm(8, elementwise_affine=False)
    assert m.weight is None and list(m.parameters()) == [] and list(m.state_dict()) == []
    assert "weight" in dict(m._parameters)  # registered as None, as torch does


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_without_weight_the_ones_are_made_once_per_device_and_dtype(impl, device):
    m = RMSNorm(8, elementwise_affine=False, impl=impl)
    x = torch.randn(2, 8, device=device)
    m(x)
    m(x)
    assert list(m._ones) == [(x.device, torch.float32)]
    kept = m._ones[(x.device, torch.float32)]
    m(x)
    assert m._ones[(x.device, torch.float32)] is kept
    assert torch.equal(kept, torch.ones(8, device=device)) and not kept.requires_grad
    m(x.to(torch.bfloat16))
    assert sorted(m._ones, key=str) == [(x.device, torch.bfloat16), (x.device, torch.float32)]


def test_without_weight_ones_made_in_inference_mode_serve_a_later_backward(device):
    m = RMSNorm(8, elementwise_affine=False)
    with torch.inference_mode():
        m(torch.randn(2, 8, device=device))
    x = torch.randn(2, 8, device=device, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None


def test_triton_path_copies_trailing_dimensions_that_cannot_be_flattened(device):
    torch.manual_seed(0)
    ours, theirs = RMSNorm((4, 16), device=device), torch.nn.RMSNorm((4, 16), device=device)
    _set_weight(ours, theirs)
    x = torch.randn(3, 16, 4, device=device).transpose(1, 2)  # (3, 4, 16) whose last two dims do not flatten
    before = call_counts()["forward"]
    y = ours(x)
    assert call_counts()["forward"] == before + 1  # the kernels ran, on a copy
    assert y.shape == x.shape and compare(y, theirs(x)).ok


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [8, (2, 4)])
def test_state_dict_moves_both_ways_between_torch_and_this_module(shape, affine):
    ours, theirs = RMSNorm(shape, elementwise_affine=affine), torch.nn.RMSNorm(shape, elementwise_affine=affine)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == (["weight"] if affine else [])
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.linspace(0.5, 1.5, theirs.weight.numel()).reshape(theirs.weight.shape))
    ours.load_state_dict(theirs.state_dict())  # strict: same keys, same shapes
    if affine:
        assert torch.equal(ours.weight, theirs.weight)
        with torch.no_grad():
            ours.weight.mul_(2)
    theirs.load_state_dict(ours.state_dict())
    if affine:
        assert torch.equal(theirs.weight, ours.weight)
        assert theirs.weight.data_ptr() != ours.weight.data_ptr()


@pytest.mark.parametrize("affine", [True, False])
def test_repr_is_torchs_with_impl_and_fallback_when_not_the_defaults(affine):
    theirs = repr(torch.nn.RMSNorm((2, 3), 1e-5, affine))
    assert repr(RMSNorm((2, 3), 1e-5, affine)) == theirs
    assert repr(RMSNorm((2, 3), 1e-5, affine, impl="reference", fallback="reference")) == (
        theirs[:-1] + ", impl='reference', fallback='reference')"
    )
    assert repr(RMSNorm(8)) == repr(torch.nn.RMSNorm(8)) == "RMSNorm((8,), eps=None, elementwise_affine=True)"


def test_impl_choice_does_not_touch_the_random_generator(device):
    after = {}
    for impl in IMPLS:
        torch.manual_seed(7)
        for affine in (True, False):
            RMSNorm((2, 32), elementwise_affine=affine, impl=impl, device=device)(torch.ones(3, 2, 32, device=device))
        after[impl] = torch.rand(4)
    assert all(torch.equal(a, after["reference"]) for a in after.values())


def test_every_impl_computes_the_reference_output_and_gradients(device):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 257, device=device)
    outs = {}
    for impl in IMPLS:
        m = RMSNorm(257, eps=1e-6, impl=impl).to(device)
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


@pytest.mark.parametrize("shape", [0, (), (4, 0), (-1,), (True,), 2.0, (2.0,)])
def test_normalized_shape_must_be_positive_ints(shape):
    with pytest.raises(ValueError, match=r"normalized_shape is .*; accepted: a positive int, or a non-empty"):
        RMSNorm(shape)


# (normalized_shape, x shape, exception): the type F.rms_norm raises for the same pair
MISMATCHES = [
    (4, (2, 3), RuntimeError),
    ((2, 3), (2, 3, 2), RuntimeError),
    ((2, 3), (3,), ValueError),
]


@pytest.mark.parametrize("shape, x_shape, error", MISMATCHES)
@pytest.mark.parametrize("impl", IMPLS)
def test_x_not_ending_in_normalized_shape_is_refused_as_torch_refuses_it(impl, shape, x_shape, error, device):
    x = torch.randn(x_shape, device=device)
    with pytest.raises(error):
        torch.nn.RMSNorm(shape, device=device)(x)
    m = RMSNorm(shape, device=device, impl=impl, fallback="reference")
    before = call_counts()
    message = re.escape(f"RMSNorm: x has shape {tuple(x_shape)}; accepted: a shape (..., ")
    with pytest.raises(error, match=message):
        m(x)
    assert call_counts() == before and m.fallback_count == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_activation_silu_computes_silu_of_the_norm_on_every_path(impl, device):
    x, gamma, dy = make_inputs((3, 5, 257), torch.float32, device)
    m = RMSNorm(257, eps=1e-6, impl=impl, activation="silu", device=device)
    with torch.no_grad():
        m.weight.copy_(gamma)
    xl = x.clone().requires_grad_()
    y = m(xl)
    y.backward(dy)
    for name, got, want in zip(("y", "dx", "dweight"), (y, xl.grad, m.weight.grad), oracle(x, gamma, dy, 1e-6, "silu")):
        c = compare(got, want)
        assert c.ok, f"{impl} {name}: max_abs {c.max_abs:.3g}"


def test_activation_is_keyword_only_checked_and_in_the_repr():
    with pytest.raises(ValueError, match=r"activation is 'relu'; accepted: None or 'silu'"):
        RMSNorm(8, activation="relu")
    assert repr(RMSNorm(8, activation="silu")) == "RMSNorm((8,), eps=None, elementwise_affine=True, activation='silu')"


@pytest.mark.parametrize("residual_in_fp32", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_forward_with_a_residual_returns_the_norm_of_the_sum_and_the_sum_on_every_path(impl, residual_in_fp32, device):
    x, gamma, dy = make_inputs((3, 5, 2, 8), torch.bfloat16, device)
    residual = make_inputs((3, 5, 2, 8), torch.bfloat16, device, seed=1)[0]
    m = RMSNorm((2, 8), eps=1e-6, impl=impl, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(0.5, 1.5, 16).reshape(2, 8))
    y, h = m(x, residual, residual_in_fp32=residual_in_fp32)
    want_h = x.float() + residual.float()
    if not residual_in_fp32:
        want_h = want_h.to(torch.bfloat16)
    assert h.shape == x.shape and torch.equal(h, want_h)
    assert torch.equal(y, m(h).to(y.dtype))  # the norm of h as returned, in the dtype y has without a residual


@pytest.mark.parametrize("impl", IMPLS)
def test_residual_arguments_are_checked_alike_on_every_path_before_flattening(impl):
    m = RMSNorm((4, 16), impl=impl)
    x = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match=r"residual_in_fp32 is True without a residual; accepted: False"):
        m(x, residual_in_fp32=True)
    for residual in (torch.randn(2, 64), torch.randn(8, 16), [1.0]):  # same numel as x, or not a tensor
        with pytest.raises(
            ValueError,
            match=r"^RMSNorm: residual .*; accepted: (x's shape, \(2, 4, 16\)|a torch\.Tensor of x's shape)$",
        ):
            m(x, residual)


@pytest.mark.parametrize("fallback", [None, "reference"])
@pytest.mark.parametrize("impl", ["reference", "native", "triton"])
def test_every_path_takes_float64_with_a_residual_too(impl, fallback, device):
    m = RMSNorm(8, impl=impl, fallback=fallback, dtype=torch.float64, device=device)
    x, residual = (torch.randn(3, 8, dtype=torch.float64, device=device) for _ in range(2))
    y, h = m(x, residual)
    assert y.dtype == h.dtype == torch.float64 and torch.equal(h, x + residual)
    assert m.fallback_count == 0


def test_residual_in_fp32_keeps_y_in_x_dtype_on_every_path(device):
    x, residual = (torch.randn(3, 8, device=device, dtype=torch.bfloat16) for _ in range(2))
    for impl in IMPLS:
        y, h = RMSNorm(8, impl=impl, device=device, dtype=torch.bfloat16)(x, residual, residual_in_fp32=True)
        assert (y.dtype, h.dtype) == (torch.bfloat16, torch.float32), impl


def test_with_fallback_the_residual_add_still_runs_in_the_fused_kernels_where_the_contract_accepts_it(
    device, monkeypatch
):
    from rmsnorm_kernel.ops import module

    fused = []
    real = module.rmsnorm
    monkeypatch.setattr(module, "rmsnorm", lambda *a, **k: fused.append("residual" in k) or real(*a, **k))
    m = RMSNorm(16, impl="triton", fallback="reference", device=device)
    x, residual = (torch.randn(3, 16, device=device) for _ in range(2))
    y, h = m(x, residual)
    assert fused == [True] and m.fallback_count == 0
    assert torch.equal(h, x + residual)
