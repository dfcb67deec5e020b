"""ops/tolerances.compare: the allclose rule with the declared tolerance, and what it reports."""

import math

import pytest
import torch

from rmsnorm_kernel.ops.tolerances import TOLERANCES, compare


def test_worst_over_tol_is_the_largest_difference_in_units_of_the_elements_own_tolerance():
    tol = TOLERANCES[torch.float32]  # atol 1e-5, rtol 1e-4
    expected = torch.tensor([0.0, 1.0, 100.0], dtype=torch.float64).float()
    # differences: 0.5e-5 at 0 (allowed 1e-5), 2.2e-4 at 1 (allowed 1.1e-4), 1e-3 at 100 (allowed 1.001e-2)
    actual = expected + torch.tensor([0.5e-5, 2.2e-4, 1e-3])
    c = compare(actual, expected)
    assert c.tolerance == tol and not c.ok
    assert c.worst_over_tol == pytest.approx(2.0, rel=1e-3)  # the element at 1.0, by its own allowance
    assert c.max_abs == pytest.approx(1e-3, rel=1e-3)  # the largest absolute difference is another element


def test_a_comparison_that_passes_has_worst_over_tol_at_most_one():
    expected = torch.linspace(-3, 3, 101)
    c = compare(expected * (1 + 0.5e-4), expected)
    assert c.ok and 0.0 < c.worst_over_tol <= 1.0


def test_a_nan_the_other_side_lacks_is_past_any_tolerance():
    c = compare(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))
    assert not c.ok and math.isinf(c.worst_over_tol)
