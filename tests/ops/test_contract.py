"""Every contract violation is refused with ContractError, a message naming the problem, and no kernel run;
an x without rows is none (rows of zero elements are one), and it is checked for everything else."""

import pytest
import torch

from rmsnorm_kernel import ContractError, call_counts, rmsnorm
from rmsnorm_kernel.ops import kernels
from rmsnorm_kernel.ops.contract import MAX_N, check_forward


@pytest.fixture
def no_kernel_may_run(monkeypatch):
    """Replace the launchers so that any launch fails the test: a rejection must come before it."""

    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched for an input the contract should have refused")

    monkeypatch.setattr(kernels, "rmsnorm_forward", launched)
    monkeypatch.setattr(kernels, "rmsnorm_backward", launched)


CASES = {
    # name: (builder(device) -> (x, gamma, eps, requires_grad), message regex)
    "x_last_dim_strided": (
        lambda d: (torch.randn(8, 6, device=d).t(), torch.ones(8, device=d), 1e-6),
        r"x has a last dimension of stride 6 .*accepted: a last dimension of stride 1 and rows at one uniform stride",
    ),
    "x_every_other_column": (
        lambda d: (torch.randn(4, 12, device=d)[:, ::2], torch.ones(6, device=d), 1e-6),
        r"x has a last dimension of stride 2",
    ),
    "x_rows_at_two_strides": (
        lambda d: (torch.randn(4, 6, 8, device=d)[:, :3, :], torch.ones(8, device=d), 1e-6),
        r"x has rows that no single row stride reaches \(shape \(4, 3, 8\), strides \(48, 8, 1\)\)",
    ),
    "x_batch_transposed": (
        lambda d: (torch.randn(3, 4, 8, device=d).transpose(0, 1), torch.ones(8, device=d), 1e-6),
        r"x has rows that no single row stride reaches",
    ),
    "gamma_not_contiguous": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(12, device=d)[::2], 1e-6),
        r"gamma is not contiguous",
    ),
    "x_float64": (
        lambda d: (
            torch.randn(4, 6, device=d, dtype=torch.float64),
            torch.ones(6, device=d, dtype=torch.float64),
            1e-6,
        ),
        r"x has dtype torch.float64; accepted: float32, float16 or bfloat16",
    ),
    "x_int": (
        lambda d: (torch.ones(4, 6, device=d, dtype=torch.int32), torch.ones(6, device=d), 1e-6),
        r"x has dtype torch.int32",
    ),
    "gamma_float64": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float64), 1e-6),
        r"gamma has dtype torch.float64",
    ),
    "dtypes_differ": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float16), 1e-6),
        r"x and gamma have dtypes torch.float32 and torch.float16; accepted: the same dtype, or x float16/bfloat16 with gamma float32",
    ),
    "half_pair_differs": (
        lambda d: (
            torch.randn(4, 6, device=d, dtype=torch.float16),
            torch.ones(6, device=d, dtype=torch.bfloat16),
            1e-6,
        ),
        r"have dtypes torch.float16 and torch.bfloat16",
    ),
    "devices_differ": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device="meta"), 1e-6),
        r"x and gamma are on .* and meta; accepted: both on the same device",
    ),
    "device_not_served": (
        lambda d: (torch.randn(4, 6, device="meta"), torch.ones(6, device="meta"), 1e-6),
        r"x is on meta; accepted: (cpu|cuda) tensors",
    ),
    "gamma_wrong_length": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(7, device=d), 1e-6),
        r"gamma has shape \(7,\); accepted: shape \(6,\)",
    ),
    "gamma_2d": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(1, 6, device=d), 1e-6),
        r"gamma has shape \(1, 6\)",
    ),
    "x_rows_of_zero_elements": (
        lambda d: (torch.randn(4, 0, device=d), torch.ones(0, device=d), 1e-6),
        rf"x has rows of N = 0 elements \(shape \(4, 0\)\); accepted: 1 <= N <= {MAX_N} \(x may have zero rows, but not rows of zero elements\)",
    ),
    "x_no_rows_of_zero_elements": (
        lambda d: (torch.randn(0, 0, device=d), torch.ones(0, device=d), 1e-6),
        r"x has rows of N = 0 elements \(shape \(0, 0\)\)",
    ),
    "x_1d_of_zero_elements": (
        lambda d: (torch.randn(0, device=d), torch.ones(0, device=d), 1e-6),
        r"x has rows of N = 0 elements \(shape \(0,\)\)",
    ),
    "x_0d": (lambda d: (torch.tensor(1.0, device=d), torch.ones(1, device=d), 1e-6), r"x is a 0-d tensor"),
    "eps_zero": (
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), 0.0),
        r"eps is 0.0; accepted: a finite number > 0",
    ),
    "eps_negative": (lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), -1e-6), r"eps is -1e-06"),
    "eps_nan": (lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("nan")), r"eps is nan"),
    "eps_inf": (lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("inf")), r"eps is inf"),
    "eps_bool": (lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), True), r"eps is True"),
    "eps_str": (lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), "1e-6"), r"eps is '1e-6'"),
    "x_not_tensor": (lambda d: ([[1.0, 2.0]], torch.ones(2, device=d), 1e-6), r"x is a list; accepted: a torch.Tensor"),
    "n_too_large": (
        lambda d: (torch.randn(2, MAX_N + 1, device=d), torch.ones(MAX_N + 1, device=d), 1e-6),
        rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_contract_violation_is_refused_before_any_kernel(name, device, no_kernel_may_run):
    build, message = CASES[name]
    x, gamma, eps = build(device)
    before = call_counts()
    x_before = x.clone() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None
    with pytest.raises(ContractError, match=message):
        rmsnorm(x, gamma, eps)
    assert call_counts() == before
    if x_before is not None:
        assert torch.equal(x, x_before)


def test_rows_of_zero_elements_are_reported_before_a_gamma_of_another_length(device, no_kernel_may_run):
    """The contract names N = 0, not gamma: asking for a gamma of shape (0,) would lead to the next refusal."""
    with pytest.raises(ContractError, match=r"x has rows of N = 0 elements \(shape \(4, 0\)\)"):
        rmsnorm(torch.randn(4, 0, device=device), torch.ones(6, device=device))


NO_ROWS_CASES = {
    # An x without rows is accepted, but checked like any other x: each of these is refused for its own reason.
    "eps_zero": (
        lambda d: (torch.randn(0, 6, device=d), torch.ones(6, device=d), 0.0),
        r"eps is 0.0; accepted: a finite number > 0",
    ),
    "x_float64": (
        lambda d: (
            torch.randn(0, 6, device=d, dtype=torch.float64),
            torch.ones(6, device=d, dtype=torch.float64),
            1e-6,
        ),
        r"x has dtype torch.float64",
    ),
    "dtypes_differ": (
        lambda d: (torch.randn(0, 6, device=d), torch.ones(6, device=d, dtype=torch.bfloat16), 1e-6),
        r"x and gamma have dtypes torch.float32 and torch.bfloat16",
    ),
    "gamma_wrong_length": (
        lambda d: (torch.randn(2, 0, 6, device=d), torch.ones(7, device=d), 1e-6),
        r"gamma has shape \(7,\); accepted: shape \(6,\)",
    ),
    "n_too_large": (
        lambda d: (torch.randn(0, MAX_N + 1, device=d), torch.ones(MAX_N + 1, device=d), 1e-6),
        rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
    ),
}


@pytest.mark.parametrize("name", sorted(NO_ROWS_CASES))
def test_x_without_rows_is_still_refused_for_every_other_violation(name, device, no_kernel_may_run):
    x, gamma, eps = NO_ROWS_CASES[name][0](device)
    with pytest.raises(ContractError, match=NO_ROWS_CASES[name][1]):
        rmsnorm(x, gamma, eps)


@pytest.mark.parametrize(
    "layout",
    [
        lambda d: torch.randn(8, 6, device=d).t(),  # last dimension of stride 6
        lambda d: torch.randn(3, 4, 8, device=d).transpose(0, 1),  # rows at two strides
    ],
    ids=["last_dim_strided", "batch_transposed"],
)
def test_x_without_rows_is_accepted_whatever_its_strides(layout, device):
    """No element is read, and PyTorch calls every empty tensor contiguous: the layout checks, which
    refuse the same strides with rows, are skipped."""
    full = layout(device)
    gamma = torch.ones(full.shape[-1], device=device)
    with pytest.raises(ContractError, match="stride"):
        check_forward(full, gamma, 1e-6)
    no_rows = full[:0]
    check_forward(no_rows, gamma, 1e-6)
    y = rmsnorm(no_rows, gamma)
    assert y.shape == no_rows.shape and y.is_contiguous()


def test_direct_op_call_is_checked_too(device, no_kernel_may_run):
    with pytest.raises(ContractError, match="x has dtype torch.float64"):
        torch.ops.rmsnorm_kernel.rmsnorm(
            torch.randn(2, 4, dtype=torch.float64, device=device),
            torch.ones(4, dtype=torch.float64, device=device),
            1e-6,
        )


def test_max_n_is_65536():
    assert MAX_N == 65536


def test_contract_error_is_a_value_error():
    assert issubclass(ContractError, ValueError)
