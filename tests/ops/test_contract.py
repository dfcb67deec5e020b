"""Every contract violation of ``rmsnorm_kernel.testing.CONTRACT_VIOLATIONS`` is refused with a ContractError
that names the argument at fault and what is accepted, before any kernel launches; an x without rows is no
violation by itself (rows of zero elements are one), and it is checked for everything else."""

import pytest
import torch

from rmsnorm_kernel import ContractError, call_counts, rmsnorm
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.testing import CONTRACT_VIOLATIONS, kernel_launches_forbidden

VIOLATIONS = {v.name: v for v in CONTRACT_VIOLATIONS}


@pytest.fixture
def no_kernel_may_run():
    """Every Triton kernel is a tripwire during the test: a refusal must come before any launch."""
    with kernel_launches_forbidden():
        yield


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_contract_violation_is_refused_naming_its_argument_before_any_kernel(name, device, no_kernel_may_run):
    v = VIOLATIONS[name]
    x, gamma, eps = v.build(device)
    before = call_counts()
    x_before = x.clone() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None
    with pytest.raises(ContractError) as refusal:
        rmsnorm(x, gamma, eps, **v.kwargs(device))
    assert v.problems(str(refusal.value)) == []
    assert call_counts() == before
    if x_before is not None:
        assert torch.equal(x, x_before)


def test_direct_op_call_is_checked_too(device, no_kernel_may_run):
    with pytest.raises(ContractError, match="x has dtype torch.complex64"):
        x = torch.randn(2, 4, dtype=torch.complex64, device=device)
        torch.ops.rmsnorm_kernel.rmsnorm(x, torch.ones(4, device=device), 1e-6)


def test_max_n_is_65536():
    assert MAX_N == 65536


def test_contract_error_is_a_value_error():
    assert issubclass(ContractError, ValueError)
