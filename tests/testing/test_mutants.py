"""The BLOCK-denominator mutants: the real kernels' source with only ``/ N`` made ``/ BLOCK_N``, wrong
where N is not a power of two and indistinguishable from the real kernels where it is."""

import inspect
import textwrap

import pytest
import torch

from rmsnorm_kernel import oracle, rmsnorm
from rmsnorm_kernel.ops import kernels, launch
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs, mutants
from tests.helpers import launch_checking_parameters

EPS = 1e-6
#: The whole-row kernels that have a mutant, and how many means each computes: the forward's mean of
#: x^2; the backward's mean of x^2 (for r) and mean of u * x.
MEANS = {"_rmsnorm_fwd_kernel": 1, "_rmsnorm_bwd_kernel": 2}


@pytest.mark.parametrize("name", sorted(MEANS))
def test_mutant_source_differs_from_the_kernel_only_by_the_denominator(name):
    real = textwrap.dedent(inspect.getsource(getattr(kernels, name).fn)).splitlines()
    mutant = textwrap.dedent(inspect.getsource(mutants.block_mean_kernel(name).fn)).splitlines()  # what runs
    assert len(mutant) == len(real)
    changed = [(old, new) for old, new in zip(real, mutant) if old != new]
    (old_def, new_def), *substituted = changed
    assert new_def == old_def.replace(f"def {name}(", f"def {name}_block_mean(")
    assert len(substituted) == MEANS[name]
    for old, new in substituted:
        # the same text around each '/ N', and '/ BLOCK_N' in its place
        assert old.count("/ N") >= 1 and new.split("/ BLOCK_N") == old.split("/ N"), (old, new)


def test_a_kernel_without_a_division_by_n_has_no_mutant():
    with pytest.raises(ValueError, match="_dgamma_column_sum_kernel has no '/ N' to replace"):
        mutants.block_mean_source(kernels._dgamma_column_sum_kernel)


def test_mutant_forward_fails_at_n_257_and_passes_at_n_256(device):
    for n, caught in ((257, True), (256, False)):
        x, gamma, dy = make_inputs((17, n), torch.float32, device)
        y, _, _ = oracle(x, gamma, dy, EPS)
        assert compare(rmsnorm(x, gamma, EPS), y).ok  # the real kernel passes at both
        assert compare(mutants.forward_block_mean(x, gamma, EPS), y).ok is not caught, n


def test_mutant_dx_fails_at_n_257_and_passes_at_n_256(device):
    for n, caught in ((257, True), (256, False)):
        x, gamma, dy = make_inputs((17, n), torch.float32, device)
        _, dx, _ = oracle(x, gamma, dy, EPS)
        assert compare(mutants.dx_block_mean(dy, x, gamma, EPS), dx).ok is not caught, n


def test_row_of_257_ones_gives_1_411458_instead_of_0_9999995(device):
    x = torch.ones(1, 257, device=device)
    gamma = torch.ones(257, device=device)
    torch.testing.assert_close(rmsnorm(x, gamma, EPS).cpu(), torch.full((1, 257), 0.9999995), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        mutants.forward_block_mean(x, gamma, EPS).cpu(), torch.full((1, 257), 1.411458), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("n, branch", [(10000, "reread_rows"), (20000, "looped")])
def test_mutant_refuses_rows_wider_than_the_row_limit(n, branch, device):
    x, gamma, _ = make_inputs((1, n), torch.float32, device)
    assert launch.plan_for(x, gamma).bwd_branch == branch
    with pytest.raises(ValueError, match=f"N = {n} is wider than launch.ROW_LIMIT"):
        mutants.forward_block_mean(x, gamma, EPS)


def test_mutants_are_launched_with_their_kernels_parameters_only(device, monkeypatch):
    real = mutants.block_mean_kernel
    monkeypatch.setattr(mutants, "block_mean_kernel", lambda name: launch_checking_parameters(real(name)))
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    mutants.forward_block_mean(x, gamma, EPS)
    mutants.dx_block_mean(dy, x, gamma, EPS)
