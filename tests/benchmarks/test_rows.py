"""One row checked then timed, without timing anything: byte model, oracle check, winners.

Timings are injected (a fake timer), never measured: no assertion here depends on how fast anything runs.
"""

import pytest
import torch

from benchmarks.impls import EPS, FWD, FWD_BWD
from benchmarks.rows import Result, bytes_moved, check_outputs, mark_winners, measure_row, tbps
from rmsnorm_kernel.ops.reference import manual_backward, oracle, rmsnorm_reference
from rmsnorm_kernel.testing import make_inputs

from .helpers import FakeTimer


def test_forward_bytes_are_x_read_y_written_and_gamma():
    assert bytes_moved(FWD, 128, 257, torch.float32) == 2 * 128 * 257 * 4 + 257 * 4
    assert bytes_moved(FWD, 4096, 4096, torch.bfloat16) == 2 * 4096 * 4096 * 2 + 4096 * 2


def test_forward_backward_bytes_are_five_tensors_plus_gamma_and_dgamma():
    assert bytes_moved(FWD_BWD, 2048, 65536, torch.bfloat16) == 5 * 2048 * 65536 * 2 + 2 * 65536 * 2
    # mixed precision: the M x N tensors at x's width, gamma and dgamma at gamma's
    assert bytes_moved(FWD_BWD, 32, 257, torch.bfloat16, torch.float32) == 5 * 32 * 257 * 2 + 2 * 257 * 4


def test_bytes_of_an_unknown_mode_are_refused():
    with pytest.raises(ValueError, match="mode is 'bwd'"):
        bytes_moved("bwd", 1, 1, torch.float32)


def test_tbps_is_bytes_over_seconds():
    assert tbps(4 * 10**12, 2.0) == pytest.approx(2.0)
    assert tbps(10, None) is None


def test_check_names_the_wrong_output_of_a_backward(device):
    x, gamma, dy = make_inputs((6, 33), torch.float32, device)
    y = rmsnorm_reference(x, gamma)
    dx, dgamma = manual_backward(x, gamma, dy)
    expected = (y, dx, dgamma)
    assert check_outputs(expected, expected).ok
    bad = check_outputs((y, dx, dgamma * 1.01), expected)
    assert not bad.ok and bad.detail.startswith("dgamma outside tolerance")
    wrong_dtype = check_outputs((y, dx.half(), dgamma), expected)
    assert not wrong_dtype.ok and "dx: got" in wrong_dtype.detail
    missing = check_outputs((y, None, dgamma), expected)
    assert not missing.ok and missing.detail.startswith("dx: got None")


def test_check_applies_the_declared_tolerance_of_each_dtype():
    """float32's declared atol is 1e-5 (rtol 1e-4): 5e-6 off a zero passes, 5e-5 fails; bfloat16's
    declared atol is 3 * 2**-7, so 5e-5 off a zero passes there."""
    zero32 = torch.zeros(3)
    assert check_outputs((zero32 + 5e-6,), (zero32,)).ok
    assert not check_outputs((zero32 + 5e-5,), (zero32,)).ok
    zero16 = torch.zeros(3, dtype=torch.bfloat16)
    assert check_outputs((zero16 + 5e-5,), (zero16,)).ok


def _result(impl, mode, events_us, ok=True, shape="8x8"):
    return Result(
        shape=shape,
        M=8,
        N=8,
        dtype="float32",
        mode=mode,
        impl=impl,
        ok=ok,
        detail="" if ok else "y outside tolerance",
        max_abs=0.0,
        max_rel=0.0,
        bytes=1000,
        events_us=events_us if ok else None,
    )


def test_winner_is_the_fastest_correct_row_of_each_group_and_triton_gets_its_speedup():
    rows = [
        _result("triton", FWD, 10.0),
        _result("F.rms_norm", FWD, 12.0),
        _result("liger", FWD, 1.0, ok=False),
        _result("triton", FWD_BWD, 30.0),
        _result("compile", FWD_BWD, 20.0),
        _result("triton", FWD, 50.0, shape="16x16"),  # a group of its own, alone in it
    ]
    mark_winners(rows)
    assert [r.winner for r in rows] == [True, False, False, False, True, True]
    assert rows[0].speedup_vs_best_peer == pytest.approx(1.2)  # the failed liger row is no peer
    assert rows[3].speedup_vs_best_peer == pytest.approx(20.0 / 30.0)
    assert rows[5].speedup_vs_best_peer is None


def test_a_row_is_checked_on_the_rows_asked_only(device):
    """With ``rows``, the oracle's y and dx hold those rows only: a wrong row elsewhere goes unseen, a
    wrong row among them fails the check; dgamma is always whole."""
    x, gamma, dy = make_inputs((6, 33), torch.float32, device)
    y = rmsnorm_reference(x, gamma)
    dx, dgamma = manual_backward(x, gamma, dy)
    expected = (y[[0, 5]], dx[[0, 5]], dgamma)
    bad_row_3, bad_row_5 = dx.clone(), dx.clone()
    bad_row_3[3] += 1.0
    bad_row_5[5] += 1.0
    assert check_outputs((y, bad_row_3, dgamma), expected, [0, 5]).ok
    bad = check_outputs((y, bad_row_5, dgamma), expected, [0, 5])
    assert not bad.ok and bad.detail.startswith("dx outside tolerance")
    timer = FakeTimer()
    row = measure_row(FWD, "reference", rmsnorm_reference, (x, gamma, dy), expected, timer, rows=[0, 5])
    assert row.ok and row.checked_rows == 2 and timer.calls == 1 and row.first_call_s is not None


def test_a_timing_that_raises_leaves_a_checked_untimed_row(device):
    def boom(call, restore, verify):
        raise RuntimeError("CUDA out of memory")

    inputs = make_inputs((4, 33), torch.float32, device)
    expected = oracle(*inputs, EPS)
    row = measure_row(FWD_BWD, "reference", rmsnorm_reference, inputs, expected, boom, 1e12)
    assert row.ok and row.events_us is None and row.pct_of_ceiling is None
    assert row.gpu_note == "timing raised RuntimeError: CUDA out of memory"
