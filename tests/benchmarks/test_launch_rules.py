"""The launch-rule benchmark's variants: what it times against the shipped plan (planning only, no GPU)."""

from benchmarks import launch_rules
from rmsnorm_kernel.ops import launch


def test_rows_read_twice_are_timed_against_two_steps_and_every_reread_setting():
    rows, n = 10**4, 16384
    base = launch.plan(rows, n, launch.H200, None, 2, 2)
    assert base.bwd_branch == "reread_rows"
    variants = launch_rules.backward_variants(base, rows, n, 2, launch.H200, 2)
    assert variants["two_steps"].bwd_branch == "looped" and variants["two_steps"].looped
    assert (base.bwd_warps, base.bwd_grid[0] // launch.H200.sms, base.bwd_stages) == (32, 1, 1)
    # all but the shipped setting (the same plan as "base": not timed twice) and the two-stage settings of
    # two programs a multiprocessor, whose stage buffers (160 KiB each) do not fit twice
    names = {"reread_w8_p2_s1", "reread_w16_p1_s1", "reread_w16_p1_s2", "reread_w32_p1_s2"}
    assert names == {name for name in variants if name.startswith("reread_")}
    assert all(variants[name].bwd_reread and variants[name].bwd_block_m == 1 for name in names)


def test_rows_too_wide_to_read_twice_get_only_the_two_steps():
    rows, n = 10**3, 65536
    base = launch.plan(rows, n, launch.H200, None, 2, 2)
    variants = launch_rules.backward_variants(base, rows, n, 2, launch.H200, 2)
    assert base.looped and not any(name.startswith("reread_") for name in variants)
    assert any(name.startswith("stats") for name in variants)
