"""The benchmark command's logic without timing anything: byte model, oracle check, winners, table and JSON.

Timings are injected (a fake timer), never measured: no assertion here depends on how fast anything runs.
"""

import argparse
import json
import math

import pytest
import torch

from rmsnorm_kernel.checks import benchmark as bm
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import manual_backward, oracle, rmsnorm_reference
from rmsnorm_kernel.testing import forward_block_mean, make_inputs


def test_forward_bytes_are_x_read_y_written_and_gamma():
    assert bm.bytes_moved(bm.FWD, 128, 257, torch.float32) == 2 * 128 * 257 * 4 + 257 * 4
    assert bm.bytes_moved(bm.FWD, 4096, 4096, torch.bfloat16) == 2 * 4096 * 4096 * 2 + 4096 * 2


def test_forward_backward_bytes_are_five_tensors_plus_gamma_and_dgamma():
    assert bm.bytes_moved(bm.FWD_BWD, 2048, 65536, torch.bfloat16) == 5 * 2048 * 65536 * 2 + 2 * 65536 * 2
    # mixed precision: the M x N tensors at x's width, gamma and dgamma at gamma's
    assert bm.bytes_moved(bm.FWD_BWD, 32, 257, torch.bfloat16, torch.float32) == 5 * 32 * 257 * 2 + 2 * 257 * 4


def test_bytes_of_an_unknown_mode_are_refused():
    with pytest.raises(ValueError, match="mode is 'bwd'"):
        bm.bytes_moved("bwd", 1, 1, torch.float32)


def test_tbps_is_bytes_over_seconds():
    assert bm.tbps(4 * 10**12, 2.0) == pytest.approx(2.0)
    assert bm.tbps(10, None) is None


class FakeTimer:
    """Returns fixed timings and counts what it was asked to time."""

    def __init__(self, events_s=1e-4, do_bench_s=2e-4, host_s=1e-5):
        self.timing = bm.Timing(events_s, do_bench_s, host_s, "do_bench")
        self.calls = 0

    def __call__(self, call, restore, verify):
        assert verify(call()) is None  # the call must at least run, and give the right answer
        restore()
        self.calls += 1
        return self.timing


def _factory(impls):
    return lambda name, device: impls.get(name)


def _quiet(line):
    pass


def test_a_wrong_implementation_fails_its_check_is_not_timed_and_cannot_win(device):
    impls = {
        "right": lambda x, g: rmsnorm_reference(x, g, bm.EPS),
        # The BLOCK-denominator mutant: fast, plausible, wrong at N = 257.
        "wrong": lambda x, g: forward_block_mean(x, g, bm.EPS),
    }
    timer = FakeTimer(events_s=1e-4)
    results = bm.run_benchmark(
        [(5, 257, "float32")], ["wrong", "right"], device, timer, None, log=_quiet, impl_factory=_factory(impls)
    )
    by = {(r.impl, r.mode): r for r in results}
    assert not by[("wrong", bm.FWD)].ok and "y outside tolerance" in by[("wrong", bm.FWD)].detail
    assert by[("wrong", bm.FWD)].events_us is None and not by[("wrong", bm.FWD)].winner
    assert by[("right", bm.FWD)].ok and by[("right", bm.FWD)].winner
    assert timer.calls == 2  # the two "right" rows only: a failed row is never timed
    # the mutant has no autograd formula: asked for a gradient it raises, which fails its row too
    assert not by[("wrong", bm.FWD_BWD)].ok and by[("wrong", bm.FWD_BWD)].detail.startswith("raised")


def test_check_names_the_wrong_output_of_a_backward(device):
    x, gamma, dy = make_inputs((6, 33), torch.float32, device)
    y = rmsnorm_reference(x, gamma)
    dx, dgamma = manual_backward(x, gamma, dy)
    expected = (y, dx, dgamma)
    assert bm.check_outputs(expected, expected).ok
    bad = bm.check_outputs((y, dx, dgamma * 1.01), expected)
    assert not bad.ok and bad.detail.startswith("dgamma outside tolerance")
    wrong_dtype = bm.check_outputs((y, dx.half(), dgamma), expected)
    assert not wrong_dtype.ok and "dx: got" in wrong_dtype.detail
    missing = bm.check_outputs((y, None, dgamma), expected)
    assert not missing.ok and missing.detail.startswith("dx: got None")


def test_check_applies_the_declared_tolerance_of_each_dtype():
    """float32's declared atol is 1e-5 (rtol 1e-4): 5e-6 off a zero passes, 5e-5 fails; bfloat16's
    declared atol is 3 * 2**-7, so 5e-5 off a zero passes there."""
    zero32 = torch.zeros(3)
    assert bm.check_outputs((zero32 + 5e-6,), (zero32,)).ok
    assert not bm.check_outputs((zero32 + 5e-5,), (zero32,)).ok
    zero16 = torch.zeros(3, dtype=torch.bfloat16)
    assert bm.check_outputs((zero16 + 5e-5,), (zero16,)).ok


def test_an_implementation_that_raises_is_a_failed_row():
    def boom(x, g):
        raise RuntimeError("no kernel for you")

    results = bm.run_benchmark(
        [(2, 8, "float32")], ["boom"], "cpu", FakeTimer(), None, log=_quiet, impl_factory=_factory({"boom": boom})
    )
    assert [r.ok for r in results] == [False, False]
    assert "raised RuntimeError: no kernel for you" in results[0].detail
    assert all(r.events_us is None and not r.winner for r in results)


def _result(impl, mode, events_us, ok=True, shape="8x8"):
    return bm.Result(
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
        _result("triton", bm.FWD, 10.0),
        _result("F.rms_norm", bm.FWD, 12.0),
        _result("liger", bm.FWD, 1.0, ok=False),
        _result("triton", bm.FWD_BWD, 30.0),
        _result("compile", bm.FWD_BWD, 20.0),
        _result("triton", bm.FWD, 50.0, shape="16x16"),  # a group of its own, alone in it
    ]
    bm.mark_winners(rows)
    assert [r.winner for r in rows] == [True, False, False, False, True, True]
    assert rows[0].speedup_vs_best_peer == pytest.approx(1.2)  # the failed liger row is no peer
    assert rows[3].speedup_vs_best_peer == pytest.approx(20.0 / 30.0)
    assert rows[5].speedup_vs_best_peer is None


def test_table_and_json_from_a_tiny_run_with_an_injected_timer(device, tmp_path):
    """End to end on the kernels' device with a fake timer: the numbers derive from the timer's."""
    timer = FakeTimer(events_s=1e-4, do_bench_s=2e-4, host_s=1e-5)
    ceiling = 2e12  # bytes/s
    impls = ["triton", "reference", "F.rms_norm"]
    results = bm.run_benchmark([(4, 257, "float32")], impls, device, timer, ceiling, log=_quiet)
    assert timer.calls == len(impls) * 2 and all(r.ok for r in results)
    r = next(r for r in results if r.impl == "triton" and r.mode == bm.FWD_BWD)
    nbytes = 5 * 4 * 257 * 4 + 2 * 257 * 4
    assert r.bytes == nbytes
    assert r.events_us == pytest.approx(100.0) and r.gpu_us == pytest.approx(200.0) and r.host_us == pytest.approx(10.0)
    assert r.bandwidth_tbps == pytest.approx(nbytes / 1e-4 / 1e12)
    assert r.pct_of_ceiling == pytest.approx(100 * nbytes / 1e-4 / ceiling)

    args = argparse.Namespace(warmup=20, samples=50, calls=20, no_do_bench=False)
    path = bm.write(tmp_path / "out", True, "fake-gpu", ceiling, results, args)
    data = json.loads(path.read_text())
    assert path.name == "benchmark.json" and data["timed"] is True and data["device"] == "fake-gpu"
    assert data["command"] == "benchmark" and data["ok"] is True and data["protocol"]["samples"] == 50
    assert data["ceiling_tbps"] == pytest.approx(2.0)
    assert data["liger_settings"] == {"offset": 0.0, "casting_mode": "llama", "in_place": True}
    assert len(data["results"]) == 6 and {x["impl"] for x in data["results"]} == set(impls)
    assert all(
        isinstance(x["N"], int) and x["N"] == 257 for x in data["results"]
    )  # flat records, as figures reads them

    table = bm.table(results, 2.0)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["shape", "dtype", "mode", "impl"]
    assert sum(1 for line in lines if line.startswith("4x257")) == 6
    end = lines[0].index("events us") + len("events us")  # the times are aligned right, under their heading
    assert lines[2][:end].endswith(" 100.0")
    assert "x" in next(line for line in lines if " triton " in line and "vs best peer" in line)
    assert "copy ceiling: 2.00 TB/s" in lines[-1]
    assert f"{nbytes / 1e-4 / 1e12:.2f}" in table


def test_json_holds_no_nan_or_infinity_numbers(tmp_path):
    bad = bm.Result(
        shape="1x1",
        M=1,
        N=1,
        dtype="float32",
        mode=bm.FWD,
        impl="x",
        ok=False,
        detail="d",
        max_abs=math.inf,
        max_rel=math.nan,
        bytes=8,
    )
    args = argparse.Namespace(warmup=1, samples=1, calls=1, no_do_bench=True)
    path = bm.write(tmp_path, False, "cpu", None, [bad], args)

    def refuse(constant):
        raise ValueError(f"{constant} is no JSON number")

    data = json.loads(path.read_text(), parse_constant=refuse)
    row = data["results"][0]
    assert row["max_abs"] == "inf" and row["max_rel"] == "nan"  # report.jsonable's spelling
    assert data["ok"] is True  # no Triton row, nothing wrong


def test_unknown_impl_names_are_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown cuda; accepted: a comma-separated subset"):
        bm.parse_impls("triton,cuda")
    with pytest.raises(argparse.ArgumentTypeError, match="',' names no implementation"):
        bm.parse_impls(",")
    with pytest.raises(ValueError, match="impl is 'cuda'"):
        bm.make_impl("cuda", "cpu")
    assert bm.parse_impls(" triton, F.rms_norm ,") == ["triton", "F.rms_norm"]


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
    assert bm.check_outputs((y, bad_row_3, dgamma), expected, [0, 5]).ok
    bad = bm.check_outputs((y, bad_row_5, dgamma), expected, [0, 5])
    assert not bad.ok and bad.detail.startswith("dx outside tolerance")
    timer = FakeTimer()
    row = bm.measure_row(bm.FWD, "reference", rmsnorm_reference, (x, gamma, dy), expected, timer, rows=[0, 5])
    assert row.ok and row.checked_rows == 2 and timer.calls == 1 and row.first_call_s is not None


def test_a_timing_that_raises_leaves_a_checked_untimed_row(device):
    def boom(call, restore, verify):
        raise RuntimeError("CUDA out of memory")

    inputs = make_inputs((4, 33), torch.float32, device)
    expected = oracle(*inputs, bm.EPS)
    row = bm.measure_row(bm.FWD_BWD, "reference", rmsnorm_reference, inputs, expected, boom, 1e12)
    assert row.ok and row.events_us is None and row.pct_of_ceiling is None
    assert row.gpu_note == "timing raised RuntimeError: CUDA out of memory"


@pytest.mark.skipif(backend() == CUDA, reason="the CPU fallback; on a GPU the command times for real")
def test_without_a_gpu_the_command_runs_a_correctness_smoke(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bm.add_arguments(parser)
    assert bm.run(parser.parse_args(["--outputs", str(tmp_path), "--require-gpu"])) == 2
    assert "timings need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "benchmark.json").exists()
    assert bm.run(parser.parse_args(["--outputs", str(tmp_path)])) == 0
    out = capsys.readouterr()
    assert "correctness-only smoke" in out.err and "no timings" in out.out
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert data["timed"] is False and data["ceiling_tbps"] is None
    assert {r["impl"] for r in data["results"]} == {"triton", "reference", "F.rms_norm"}
    assert {(r["shape"], r["dtype"]) for r in data["results"]} == {("4x257", "float32"), ("3x33", "bfloat16")}
    assert all(r["ok"] and r["events_us"] is None for r in data["results"])


def test_liger_settings_are_liger_defaults():
    inspect = pytest.importorskip("inspect")
    rms = pytest.importorskip("liger_kernel.ops.rms_norm")
    params = inspect.signature(rms.LigerRMSNormFunction.forward).parameters
    for name, value in bm.LIGER_SETTINGS.items():
        assert params[name].default == value
