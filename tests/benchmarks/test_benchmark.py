"""The benchmark command without timing anything: its runs, table, JSON, figure, CPU smoke and usage.

Timings are injected (a fake timer), never measured: no assertion here depends on how fast anything runs.
"""

import argparse
import json
import math
import subprocess
import sys

import pytest

from benchmarks import benchmark as bm
from benchmarks.common import keep_previous
from benchmarks.figures import FIGURE
from benchmarks.impls import EPS, FWD, FWD_BWD
from benchmarks.rows import Result
from rmsnorm_kernel.checks import generated
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import rmsnorm_reference
from rmsnorm_kernel.testing import forward_block_mean
from tests.helpers import ROOT

from .helpers import FakeTimer
from .test_figures import benchmark_records, is_png

no_gpu_only = pytest.mark.skipif(backend() == CUDA, reason="the CPU fallback; on a GPU the command times for real")


def _factory(impls):
    return lambda name, device: impls.get(name)


def _quiet(line):
    pass


def test_a_wrong_implementation_fails_its_check_is_not_timed_and_cannot_win(device):
    impls = {
        "right": lambda x, g: rmsnorm_reference(x, g, EPS),
        # The BLOCK-denominator mutant: fast, plausible, wrong at N = 257.
        "wrong": lambda x, g: forward_block_mean(x, g, EPS),
    }
    timer = FakeTimer(events_s=1e-4)
    results = bm.run_benchmark(
        [(5, 257, "float32")], ["wrong", "right"], device, timer, None, log=_quiet, impl_factory=_factory(impls)
    )
    by = {(r.impl, r.mode): r for r in results}
    assert not by[("wrong", FWD)].ok and "y outside tolerance" in by[("wrong", FWD)].detail
    assert by[("wrong", FWD)].events_us is None and not by[("wrong", FWD)].winner
    assert by[("right", FWD)].ok and by[("right", FWD)].winner
    assert timer.calls == 2  # the two "right" rows only: a failed row is never timed
    # the mutant has no autograd formula: asked for a gradient it raises, which fails its row too
    assert not by[("wrong", FWD_BWD)].ok and by[("wrong", FWD_BWD)].detail.startswith("raised")


def test_an_implementation_that_raises_is_a_failed_row():
    def boom(x, g):
        raise RuntimeError("no kernel for you")

    results = bm.run_benchmark(
        [(2, 8, "float32")], ["boom"], "cpu", FakeTimer(), None, log=_quiet, impl_factory=_factory({"boom": boom})
    )
    assert [r.ok for r in results] == [False, False]
    assert "raised RuntimeError: no kernel for you" in results[0].detail
    assert all(r.events_us is None and not r.winner for r in results)


def test_table_and_json_from_a_tiny_run_with_an_injected_timer(device, tmp_path):
    """End to end on the kernels' device with a fake timer: the numbers derive from the timer's."""
    timer = FakeTimer(events_s=1e-4, do_bench_s=2e-4, host_s=1e-5)
    ceiling = 2e12  # bytes/s
    impls = ["triton", "reference", "F.rms_norm"]
    results = bm.run_benchmark([(4, 257, "float32")], impls, device, timer, ceiling, log=_quiet)
    assert timer.calls == len(impls) * 2 and all(r.ok for r in results)
    r = next(r for r in results if r.impl == "triton" and r.mode == FWD_BWD)
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
    )  # flat records, as the figure reads them

    table = bm.table(results, 2.0)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["shape", "dtype", "mode", "impl"]
    assert sum(1 for line in lines if line.startswith("4x257")) == 6
    end = lines[0].index("events us") + len("events us")  # the times are aligned right, under their heading
    assert lines[2][:end].endswith(" 100.0")
    assert "x" in next(line for line in lines if " triton " in line and "vs best peer" in line)
    assert "copy ceiling: 2.00 TB/s" in lines[-1]
    assert f"{nbytes / 1e-4 / 1e12:.2f}" in table

    line = bm.draw_figure(path, tmp_path / "out")
    figure = tmp_path / "out" / "figures" / FIGURE
    assert line.startswith(f"figure {figure}: written (6 records") and is_png(figure)


def test_json_holds_no_nan_or_infinity_numbers(tmp_path):
    bad = Result(
        shape="1x1",
        M=1,
        N=1,
        dtype="float32",
        mode=FWD,
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
    assert row["max_abs"] is None and row["max_rel"] is None  # jsonio: not a number, null
    assert data["ok"] is True  # no Triton row, nothing wrong


def test_a_figure_that_cannot_be_drawn_is_reported_and_changes_nothing_else(tmp_path, monkeypatch):
    def broken(path, out):
        raise RuntimeError("no backend\nmore")

    monkeypatch.setattr(bm, "benchmark_figure", broken)
    line = bm.draw_figure(tmp_path / "benchmark.json", tmp_path)
    assert line == f"figure {tmp_path / 'figures' / FIGURE}: failed (RuntimeError: no backend)"


def test_the_files_written_are_those_clean_removes(tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "benchmark.json").write_text(json.dumps(benchmark_records()))
    assert ": written " in bm.draw_figure(outputs / "benchmark.json", outputs)
    args = argparse.Namespace(warmup=1, samples=1, calls=1, no_do_bench=True)
    written = [bm.write(outputs, True, "fake-gpu", None, [], args), outputs / "figures" / FIGURE]
    written.append(keep_previous(written[0]))  # an earlier run's results, when it runs again
    bm.write(outputs, True, "fake-gpu", None, [], args)
    for path in written:
        assert path.is_file() and generated.is_generated_file(tmp_path, path.relative_to(tmp_path).as_posix()), path
    assert not generated.is_generated_file(tmp_path, "outputs/benchmark.md")


@no_gpu_only
def test_without_a_gpu_the_command_runs_a_correctness_smoke(tmp_path, capsys):
    assert bm.main(["--outputs", str(tmp_path), "--require-gpu"]) == 2
    assert "timings need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "benchmark.json").exists()
    assert bm.main(["--outputs", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "correctness-only smoke" in out.err and "no timings" in out.out
    assert f"figure {tmp_path / 'figures' / FIGURE}: skipped" in out.out
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert data["timed"] is False and data["ceiling_tbps"] is None
    assert {r["impl"] for r in data["results"]} == {"triton", "reference", "F.rms_norm", "seed"}
    assert {(r["shape"], r["dtype"]) for r in data["results"]} == {("4x257", "float32"), ("3x33", "bfloat16")}
    assert all(r["ok"] and r["events_us"] is None for r in data["results"])
    assert not (tmp_path / "figures" / FIGURE).exists()
    first = (tmp_path / "benchmark.json").read_text()
    assert bm.main(["--outputs", str(tmp_path)]) == 0  # again: the first run's results are kept
    assert (tmp_path / "benchmark.json.prev1").read_text() == first
    assert f"kept as {tmp_path / 'benchmark.json.prev1'}" in capsys.readouterr().out


@no_gpu_only
def test_without_a_gpu_impls_that_all_need_one_are_refused_and_keep_the_earlier_results(tmp_path, capsys):
    (tmp_path / "benchmark.json").write_text("an earlier run")
    assert bm.main(["--outputs", str(tmp_path), "--impls", "compile,liger"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "benchmark: --impls compile,liger: none of them runs without a CUDA GPU; "
        "accepted here: a subset of triton,reference,F.rms_norm,seed"
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["benchmark.json"]
    assert (tmp_path / "benchmark.json").read_text() == "an earlier run"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--impls", ","], "argument --impls: ',' names no implementation"),
        (["--impls", "triton,cuda"], "argument --impls: unknown cuda"),
        (["--samples", "-1"], "argument --samples: -1 is too small; accepted: 1 or more"),
        (["--warmup", "-1"], "argument --warmup: -1 is too small; accepted: 0 or more"),
        (["--calls", "x"], "argument --calls: 'x' is not a number"),
        (["--fast"], "unrecognized arguments: --fast"),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2_before_any_work(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        bm.main([*argv, "--outputs", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert err[0].startswith("python -m benchmarks.benchmark: ") and words in err[0]
    assert not (tmp_path / "out").exists()


def test_an_outputs_folder_that_cannot_be_written_is_refused_with_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("kept")
    assert bm.main(["--outputs", str(tmp_path / "file" / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"benchmark: --outputs {tmp_path}/file/x cannot be written (Not a directory); "
        "accepted: a folder this user can create and write"
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_help_names_the_command_and_its_options(capsys):
    with pytest.raises(SystemExit) as exc:
        bm.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: python -m benchmarks.benchmark")
    for option in ("--shapes", "--quick", "--impls", "--outputs", "--warmup", "--samples", "--calls", "--no-do-bench"):
        assert option in out
    assert "--require-gpu" in out


@pytest.mark.slow
@no_gpu_only
def test_the_command_runs_as_a_module_and_without_a_gpu_exits_2_when_one_is_required(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark", "--require-gpu", "--outputs", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "timings need a CUDA GPU" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "benchmark.json").exists()
