"""Checking and timing one point of the sweep, with injected timers: nothing here depends on a speed."""

import pytest
import torch

from benchmarks.impls import EPS, FWD, FWD_BWD, LIGER_SETTINGS
from benchmarks.rows import check_outputs
from benchmarks.sweep import measure as sm
from benchmarks.sweep.points import Point
from benchmarks.timing import Timing
from rmsnorm_kernel.ops.reference import manual_backward, oracle, rmsnorm_reference
from rmsnorm_kernel.testing import forward_block_mean, make_inputs

# --------------------------------------------------------------------------------------------------
# The oracle on the checked rows


def test_checked_rows_are_all_up_to_the_limit_then_edges_and_a_spread():
    assert sm.check_rows(4096, 4096) is None  # 2**24 elements: every row
    rows = sm.check_rows(131072, 4096)
    assert rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == 131071
    assert set(range(64)) <= set(rows) and set(range(131072 - 64, 131072)) <= set(rows)
    assert len(rows) <= 64 + 64 + 128


def test_expected_outputs_on_some_rows_are_the_oracle_on_those_rows(device):
    x, gamma, dy = make_inputs((37, 33), torch.bfloat16, device)
    rows = sm.check_rows(37, 33, full_limit=0)
    assert rows == list(range(37))  # fewer rows than the edges take: all of them, still by index
    rows = [0, 5, 36]
    y, dx, dgamma = sm.expected_outputs(x, gamma, dy, rows)
    full = oracle(x, gamma, dy)
    assert torch.equal(y, full[0][rows]) and torch.equal(dx, full[1][rows])
    assert torch.equal(dgamma, full[2])  # the same float64 sum, in chunks, rounded to bfloat16
    assert check_outputs((full[0], full[1], full[2]), (y, dx, dgamma), rows).ok
    assert not check_outputs((full[0], full[1] * 1.5, full[2]), (y, dx, dgamma), rows).ok


def test_dgamma_is_summed_over_every_row_in_chunks(device, monkeypatch):
    monkeypatch.setattr(sm, "DGAMMA_CHUNK_ELEMENTS", 64)  # 64 // 33 = 1 row per chunk
    x, gamma, dy = make_inputs((9, 33), torch.float32, device)
    _, _, dgamma = sm.expected_outputs(x, gamma, dy, [0])
    want = manual_backward(x.double(), gamma.double(), dy.double())[1].float()
    torch.testing.assert_close(dgamma, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Measuring with injected timers


class FakeTimers:
    """Fixed times; runs the call as the whole-call samples and a CUDA graph's timing would, then once
    more after ``restore`` (unless told not to), and verifies that last call."""

    def __init__(self, restore=True):
        self.restore = restore
        self.verified = []

    def __call__(self, call, restore, verify):
        for _ in range(3):  # calls back to back, as the whole-call samples do
            call()
        restore()
        for _ in range(3):  # warm-up and replays, as a CUDA graph's timing runs the call
            call()
        if self.restore:
            restore()
        problem = verify(call())
        self.verified.append(problem)
        if problem is None:
            return Timing(2e-4, 1e-4, 5e-5, sm.GRAPH)
        return Timing(2e-4, 3e-4, 5e-5, sm.PROFILER, f"replay wrong ({problem})")


class _InPlaceGrad(torch.autograd.Function):
    """A backward that writes dx over dy, as Liger's default in_place=True does."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return rmsnorm_reference(x, g, EPS)

    @staticmethod
    def backward(ctx, dy):
        x, g = ctx.saved_tensors
        dx, dg = manual_backward(x, g, dy, EPS)
        dy.copy_(dx)
        return dy, dg


def _in_place(x, g):
    return _InPlaceGrad.apply(x, g)


def _factory(impls):
    return lambda name, device: impls.get(name)


def _quiet(line):
    pass


@pytest.mark.parametrize("restore", [True, False])
def test_a_replay_is_checked_after_the_inputs_a_call_overwrites_are_put_back(device, restore):
    point = Point("tiny", "tiny", 4, 64, "float32")
    timers = FakeTimers(restore)
    (_, row) = sm.measure_point(
        point, ["inplace"], device, timers, impl_factory=_factory({"inplace": _in_place}), log=_quiet
    )
    assert row.mode == FWD_BWD and row.ok  # the first call gets its own copy of dy
    if restore:
        assert timers.verified == [None, None] and row.gpu_method == sm.GRAPH and row.gpu_us == pytest.approx(100.0)
    else:  # the calls before turned dy into dx of dx...: the replay is wrong, the profiler times it
        assert timers.verified[1] is not None and row.gpu_method == sm.PROFILER and "replay wrong" in row.gpu_note


def test_a_row_holds_both_times_its_bandwidth_and_its_share_of_the_ceiling(device):
    point = Point("large", "sweep", 4, 1024, "bfloat16")  # a stand-in: only the regime's ceiling matters here
    reference = {"reference": lambda x, g: rmsnorm_reference(x, g, EPS)}
    rows = sm.measure_point(
        point, ["reference"], device, FakeTimers(), repeat=1, impl_factory=_factory(reference), log=_quiet
    )
    row = next(r for r in rows if r.mode == FWD)
    nbytes = 2 * 4 * 1024 * 2 + 1024 * 2
    assert row.ok and row.bytes == nbytes and row.checked_rows == 4 and row.repeat == 1
    assert (row.point, row.regime, row.origin, row.split) == ("large:bfloat16:4x1024", "large", "sweep", "fit")
    assert (
        row.whole_us == pytest.approx(200.0)
        and row.host_us == pytest.approx(50.0)
        and row.gpu_us == pytest.approx(100.0)
    )
    assert row.gpu_tbps == pytest.approx(nbytes / 1e-4 / 1e12) and row.whole_tbps == pytest.approx(nbytes / 2e-4 / 1e12)
    assert row.first_call_s is not None and row.measure_s >= row.first_call_s
    ceilings = [
        dict(regime="large", gpu_tbps=2e-7),
        dict(regime="large", gpu_tbps=4e-7),
        dict(regime="mid", gpu_tbps=1.0),
    ]
    sm.apply_ceilings([row], ceilings)  # the larger of the regime's two measurements
    assert row.ceiling_tbps == 4e-7 and row.pct_of_ceiling == pytest.approx(100 * nbytes / 1e-4 / 1e12 / 4e-7)


def test_a_wrong_implementation_fails_its_check_and_is_not_timed(device):
    point = Point("tiny", "tiny", 5, 257, "float32")
    timers = FakeTimers()
    wrong = {"wrong": lambda x, g: forward_block_mean(x, g, EPS)}
    fwd, fwd_bwd = sm.measure_point(point, ["wrong"], device, timers, impl_factory=_factory(wrong), log=_quiet)
    assert not fwd.ok and "y outside tolerance" in fwd.detail and fwd.gpu_us is None and timers.verified == []
    assert not fwd_bwd.ok and fwd_bwd.detail.startswith("raised")


def test_a_timing_that_raises_leaves_the_row_checked_but_untimed_and_says_why(device):
    def boom(call, restore, verify):
        raise RuntimeError("CUDA out of memory\n  more")

    point = Point("tiny", "tiny", 3, 64, "float32")
    reference = {"reference": lambda x, g: rmsnorm_reference(x, g, EPS)}
    rows = sm.measure_point(point, ["reference"], device, boom, impl_factory=_factory(reference), log=_quiet)
    assert all(r.ok and r.gpu_us is None and r.whole_us is None for r in rows)
    assert {r.gpu_note for r in rows} == {"timing raised RuntimeError: CUDA out of memory"}


@pytest.mark.parametrize("outcome", ["graph", "wrong replay", "no capture"])
def test_gpu_time_falls_back_to_the_profiler_and_says_why(monkeypatch, outcome):
    """CudaTimers.gpu's choice, with the graph and the profiler stubbed (they need a GPU)."""
    timers, restored = sm.CudaTimers(), []

    def graph(call, restore, verify):
        if outcome == "no capture":
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1e-4, None if outcome == "graph" else "dx outside tolerance"

    monkeypatch.setattr(timers, "_graph", graph)
    monkeypatch.setattr(timers, "_profiler", lambda call: 2e-4)
    monkeypatch.setattr(sm.torch.cuda, "synchronize", lambda: None)
    seconds, method, note = timers.gpu(lambda: None, lambda: restored.append(1), lambda out: None)
    if outcome == "graph":
        assert (seconds, method, note, restored) == (1e-4, sm.GRAPH, "", [])
    else:  # the profiler times the call, on inputs put back first
        assert (seconds, method, restored) == (2e-4, sm.PROFILER, [1])
        words = (
            "replay is wrong (dx outside tolerance)"
            if outcome == "wrong replay"
            else "no CUDA graph (RuntimeError: operation not"
        )
        assert words in note and note.endswith("timed from the profiler")


def test_cuda_timers_put_the_inputs_back_between_the_two_times(monkeypatch):
    timers, order = sm.CudaTimers(), []
    monkeypatch.setattr(timers, "whole", lambda call: (order.append("whole"), (2e-4, 5e-5))[1])
    monkeypatch.setattr(timers, "gpu", lambda call, restore, verify: (order.append("gpu"), (1e-4, sm.GRAPH, ""))[1])
    timing = timers(lambda: None, lambda: order.append("restore"), lambda out: None)
    assert order == ["whole", "restore", "gpu"]
    assert timing == Timing(2e-4, 1e-4, 5e-5, sm.GRAPH, "")


def test_the_protocol_names_the_settings_of_the_run():
    p = sm.protocol(whole_s=0.05, rep_ms=30)
    assert "about 50 ms" in p["whole_call"] and "rep=30 ms" in p["gpu_time"]
    assert p["liger_settings"] == LIGER_SETTINGS
