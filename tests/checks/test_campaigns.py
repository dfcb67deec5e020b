"""The numeric campaigns: what they cover, what they compare with, and that they fail when they should."""

import math

import pytest
import torch
import triton

from rmsnorm_kernel.checks import campaigns
from rmsnorm_kernel.checks.campaigns import CampaignCase
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.launch import ROW_LIMIT
from rmsnorm_kernel.ops.reference import manual_backward, rmsnorm_reference
from rmsnorm_kernel.testing import make_inputs

HALF_AND_FLOAT = {torch.float32, torch.float16, torch.bfloat16}


def power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


# --------------------------------------------------------------------------------------------------
# What the shape lists cover (checked without running them)


def test_full_campaign_covers_what_it_claims():
    shapes, dtypes = campaigns.FULL_SHAPES, campaigns.DTYPES
    assert set(dtypes) == HALF_AND_FLOAT
    assert len(shapes) >= 28 and len(shapes) * len(dtypes) == 90  # the README's 90 cases
    rows = {math.prod(s[:-1]) for s in shapes}
    ns = {s[-1] for s in shapes}
    assert {1, 17} <= rows
    assert {255, 256, 257} <= ns
    assert len([n for n in ns if not power_of_two(n)]) >= 10
    for p in (128, 512, 1024, 4096):  # powers of two with a neighbour on each side, or the power itself
        assert p in ns or {p - 1, p + 1} <= ns, p
    assert any(len(s) > 2 for s in shapes)
    assert MAX_N in ns  # the longest row the contract accepts
    assert any(triton.next_power_of_2(n) > ROW_LIMIT for n in ns if n != MAX_N)  # another row walked in chunks


def test_quick_campaign_has_m_of_1_and_17_and_n_on_both_sides_of_a_power_of_two():
    ns = {s[-1] for s in campaigns.QUICK_SHAPES}
    assert {math.prod(s[:-1]) for s in campaigns.QUICK_SHAPES} >= {1, 17}
    assert {255, 256, 257} <= ns
    assert any(len(s) > 2 for s in campaigns.QUICK_SHAPES)


def test_campaign_gamma_is_never_all_ones(device):
    # the inputs a full campaign draws: case i is seeded with i, shapes outer and dtypes inner
    cases = [(s, d) for s in campaigns.FULL_SHAPES for d in campaigns.DTYPES]
    for seed, (shape, dtype) in enumerate(cases):
        _, gamma, _ = make_inputs(shape, dtype, device, seed=seed)
        assert not torch.all(gamma == 1), (shape, dtype)


# --------------------------------------------------------------------------------------------------
# Running a campaign


def test_campaign_gives_one_passing_record_per_shape_and_dtype(device):
    shapes = [(1, 257), (3, 2, 33)]
    cases = campaigns.run_campaign("forward", shapes=shapes, device=device)
    assert [(c.shape, c.dtype) for c in cases] == [
        (s, str(d).removeprefix("torch.")) for s in shapes for d in campaigns.DTYPES
    ]
    assert [c.seed for c in cases] == list(range(len(cases)))
    assert all(c.ok and math.isfinite(c.max_abs) and not c.error for c in cases)


@pytest.mark.parametrize("campaign", campaigns.CAMPAIGNS)
def test_campaigns_expect_the_float64_oracle_rounded_to_the_dtype(campaign, device, monkeypatch):
    """A kernel that returns the float64 formulas rounded to the dtype matches the expected values exactly."""

    def exact(*args):
        if campaign == "forward":
            x, gamma, eps = args
            return rmsnorm_reference(x.double(), gamma.double(), eps).to(x.dtype)
        if campaign == "residual":
            x, residual, gamma, dy, dh, eps = args
            h = x + residual  # torch's add: one rounding of the exact sum
            y = rmsnorm_reference(h.double(), gamma.double(), eps).to(h.dtype)
            dh_norm, dgamma = manual_backward(h.double(), gamma.double(), dy.double(), eps)
            total = dh_norm + dh.double()
            return y, h, total.to(x.dtype), total.to(residual.dtype), dgamma.to(gamma.dtype)
        dy, x, gamma, eps = args
        dx, dgamma = manual_backward(x.double(), gamma.double(), dy.double(), eps)
        return dx.to(x.dtype) if campaign == "dx" else dgamma.to(gamma.dtype)

    monkeypatch.setitem(campaigns.KERNELS[campaign], "exact", exact)
    cases = campaigns.run_campaign(campaign, kernel="exact", shapes=[(17, 257)], device=device)
    assert [c.max_abs for c in cases] == [0.0] * len(campaigns.DTYPES)


def test_block_mean_forward_fails_at_257_and_passes_at_256(device):
    cases = campaigns.run_campaign(
        "forward", kernel="block-mean", shapes=[(17, 256), (17, 257)], dtypes=[torch.float32], device=device
    )
    at = {c.shape[-1]: c for c in cases}
    assert at[256].ok
    assert not at[257].ok and at[257].max_rel > 0.1


def test_block_mean_dx_fails_at_257(device):
    (case,) = campaigns.run_campaign(
        "dx", kernel="block-mean", shapes=[(17, 257)], dtypes=[torch.float32], device=device
    )
    assert not case.ok and not case.error


def test_block_mean_refuses_rows_past_the_row_limit_and_the_case_says_so(device):
    (case,) = campaigns.run_campaign(
        "forward", kernel="block-mean", shapes=[(1, 10000)], dtypes=[torch.float32], device=device
    )
    assert not case.ok and "wider than launch.ROW_LIMIT" in case.error and math.isnan(case.max_abs)


def test_dgamma_campaign_catches_a_doubled_dgamma(device, monkeypatch):
    def doubled(dy, x, gamma, eps):
        return 2 * campaigns.triton_dgamma(dy, x, gamma, eps)

    monkeypatch.setitem(campaigns.KERNELS["dgamma"], "doubled", doubled)
    cases = campaigns.run_campaign("dgamma", kernel="doubled", shapes=[(5, 40)], device=device)
    assert len(cases) == 3 and not any(c.ok for c in cases)


def test_a_crashing_kernel_fails_its_case_and_the_campaign_goes_on(device, monkeypatch):
    def crash(x, gamma, eps):
        raise RuntimeError("launch failed\nwith a traceback below")

    monkeypatch.setitem(campaigns.KERNELS["forward"], "crash", crash)
    cases = campaigns.run_campaign(
        "forward", kernel="crash", shapes=[(2, 8), (3, 9)], dtypes=[torch.float32], device=device
    )
    assert len(cases) == 2
    assert all(not c.ok and c.error == "RuntimeError: launch failed" for c in cases)


def test_unknown_campaign_or_kernel_names_what_is_accepted():
    with pytest.raises(ValueError, match="campaign is 'y'; accepted: forward, dx, dgamma"):
        campaigns.run_campaign("y")
    with pytest.raises(ValueError, match="kernel 'block-mean' has no dgamma variant; accepted: triton"):
        campaigns.run_campaign("dgamma", kernel="block-mean")


def _case(dtype, max_abs, ok):
    return CampaignCase("forward", "triton", dtype, (1, 2), 0, max_abs, max_abs, 1e-5, 1e-4, ok)


def test_worst_case_per_dtype_prefers_a_failure_over_a_larger_passing_error():
    cases = [
        _case("float32", 1e-6, True),
        _case("float32", 5e-7, False),
        _case("float16", 1e-4, True),
        _case("float16", 2e-3, True),
    ]
    worst = campaigns.worst_per_dtype(cases)
    assert worst["float32"] is cases[1]
    assert worst["float16"] is cases[3]


def test_worst_case_per_dtype_counts_a_crash_as_the_worst():
    crashed = _case("float32", math.nan, False)
    assert campaigns.worst_per_dtype([_case("float32", 1.0, False), crashed])["float32"] is crashed
