"""The suite's comparison catches a forward that divides by BLOCK instead of N, where that matters."""

import torch

from rmsnorm_kernel import rmsnorm, rmsnorm_reference
from rmsnorm_kernel.mutants import dx_block_mean, forward_block_mean
from rmsnorm_kernel.reference import manual_backward
from rmsnorm_kernel.tolerances import compare

from .conftest import make_inputs


def test_block_denominator_forward_is_caught_at_n_257(device):
    x, gamma, _ = make_inputs((17, 257), torch.float32, device)
    assert compare(rmsnorm(x, gamma), rmsnorm_reference(x, gamma)).ok  # the real kernel passes
    assert not compare(forward_block_mean(x, gamma, 1e-6), rmsnorm_reference(x, gamma)).ok


def test_block_denominator_forward_passes_unnoticed_at_n_256(device):
    x, gamma, _ = make_inputs((17, 256), torch.float32, device)
    assert compare(forward_block_mean(x, gamma, 1e-6), rmsnorm_reference(x, gamma)).ok


def test_row_of_257_ones_shows_the_defect(device):
    x = torch.ones(1, 257, device=device)
    gamma = torch.ones(257, device=device)
    good = rmsnorm(x, gamma)
    bad = forward_block_mean(x, gamma, 1e-6)
    torch.testing.assert_close(good.cpu(), torch.full((1, 257), 0.9999995), atol=1e-6, rtol=0)
    torch.testing.assert_close(bad.cpu(), torch.full((1, 257), 1.411458), atol=1e-6, rtol=0)


def test_block_denominator_backward_is_caught_at_n_257(device):
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    dx_ref, _ = manual_backward(x, gamma, dy)
    assert not compare(dx_block_mean(dy, x, gamma, 1e-6), dx_ref).ok
