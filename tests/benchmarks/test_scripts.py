"""The scripts of ``benchmarks/``, in-process on the CPU: what they launch, check and count, never how fast."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import host_time, launch_rules, launch_sweep, train_step
from benchmarks.impls import FWD, FWD_BWD
from benchmarks.timing import Timing
from rmsnorm_kernel.ops import launch
from rmsnorm_kernel.ops.backend import CUDA, backend
from tests.helpers import ROOT

no_gpu_only = pytest.mark.skipif(backend() == CUDA, reason="what the scripts do without a GPU")


def _h200_plan(m, n, dtype):
    x_bytes = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # contiguous rows start on a 16-byte boundary exactly when a row's bytes are a multiple of 16
    return launch.plan(m, n, launch.H200, None if n * x_bytes % 16 == 0 else 1, x_bytes, x_bytes)


def test_every_sweep_variant_changes_the_plan_of_a_shape_and_is_undone_afterwards():
    """A variant that leaves every one of its shapes' plans as they are would time the base plan again
    under another name."""
    for name, constants in launch_sweep.VARIANTS.items():
        shapes = [shape for shape, variants in launch_sweep.SHAPES.items() if name in variants]
        assert shapes, f"{name} is timed at no shape"
        saved = {k: getattr(launch, k) for k in constants}
        base = {shape: _h200_plan(*shape) for shape in shapes}
        with launch_sweep.overrides(**constants):
            assert {k: getattr(launch, k) for k in constants} == constants
            changed = [shape for shape in shapes if _h200_plan(*shape) != base[shape]]
        assert changed, f"{name} launches the base plan at each of {shapes}"
        assert {k: getattr(launch, k) for k in constants} == saved
        assert all(_h200_plan(*shape) == base[shape] for shape in shapes)  # no plan made under the variant survives


def test_the_sweep_refuses_constants_an_override_would_not_reach():
    with pytest.raises(AttributeError, match="no constant TILE_ELEMENT"):
        with launch_sweep.overrides(TILE_ELEMENT=1):
            pass
    # bound into launchers.py at import: the launchers would keep launching the old value
    with pytest.raises(ValueError, match="SUM_BLOCK_P is read by the launchers"):
        with launch_sweep.overrides(SUM_BLOCK_P=16):
            pass
    assert launch.SUM_BLOCK_P != 16


class FasterEachTime:
    """A fake timer: each call it times is reported faster than the one before."""

    def __init__(self):
        self.calls = 0

    def __call__(self, call, restore=None, verify=None):
        call()
        self.calls += 1
        return Timing(1e-4 / self.calls, None, None)


@pytest.mark.slow
def test_a_sweep_checks_every_variant_against_the_oracle(device):
    """At 1200x264 float32 the rows are narrow (and aligned: rows off 16 bytes take the narrow settings
    anyway), with more tiles than programs on any GPU: two backward programs a multiprocessor, the row in
    two pieces; ``narrow_off`` gives them one program a multiprocessor and one piece. Both plans must give
    the oracle's answer."""
    timer = FasterEachTime()
    rows, plans = launch_sweep.run_sweep(
        {(1200, 264, "float32"): ("narrow_off",)}, device, timer, None, log=lambda s: None
    )
    assert [(r.impl, r.mode) for r in rows] == [
        ("base", FWD),
        ("base", FWD_BWD),
        ("narrow_off", FWD),
        ("narrow_off", FWD_BWD),
    ]
    assert all(r.ok for r in rows) and timer.calls == 4
    assert plans[1] != plans[3]
    assert [r.winner for r in rows] == [False, False, True, True]  # the variant, timed last, is faster in both modes


def test_host_time_table_gives_each_triton_path_its_ratio_to_its_native_counterpart():
    forms = host_time.FORMS
    times = {"F.rms_norm": dict(zip(forms, (10.0, 20.0, 80.0))), "rmsnorm": dict(zip(forms, (15.0, 50.0, 100.0)))}
    assert host_time.table_rows(times) == [
        ("F.rms_norm", "10.0", "20.0", "80.0"),
        ("rmsnorm", "15.0 (1.50x)", "50.0 (2.50x)", "100.0 (1.25x)"),
    ]


def test_host_time_times_every_path_and_its_native_counterpart_in_three_forms(device):
    times = host_time.host_times(device, m=4, n=33, calls=1, repeats=1, warmup=1)
    pairs = {"rmsnorm", "F.rms_norm", "RMSNorm module", "torch.nn.RMSNorm", "rmsnorm(residual=r)", "r + x, F.rms_norm"}
    assert pairs | {"autograd.Function doing nothing"} <= set(times)
    assert all(set(t) == set(host_time.FORMS) and all(v > 0 for v in t.values()) for t in times.values())


@no_gpu_only
@pytest.mark.parametrize("script", [launch_sweep, launch_rules, host_time, train_step], ids=lambda s: s.__name__)
def test_without_a_gpu_each_script_exits_2_saying_it_needs_one(script, capsys):
    assert script.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind, n", [("fwd", 3000), ("bwd", 1000), ("bwd", 9000)], ids=str)
def test_every_launch_rules_variant_is_a_plan_the_kernels_run_correctly(kind, n, device):
    """Each variant is timed only if it computes what the shipped plan computes; on the CPU the variants
    run through the interpreter at a few rows, and each must differ from the shipped plan and agree with
    it (the shipped plan is checked against the oracle by tests/ops)."""
    records = list(
        launch_rules.run_item(kind, "bfloat16", n, device, bench=lambda fn: (fn(), 1.0)[1], x_bytes_total=6 * n * 2)
    )
    names = [r["variant"] for r in records]
    assert names[0] == "base" and len(names) == len(set(names)) > 3
    assert "vec1" in names  # N = 1000, 3000 and 9000 allow vector loads of 8 bfloat16 elements
    assert all(r["ok"] and r["M"] == 6 for r in records)
    plans = [tuple(sorted(r["plan"].items())) for r in records]
    assert len(set(plans)) == len(plans)  # every variant launches something the shipped plan does not


@pytest.mark.parametrize(
    "items",
    [
        "fwd:bfloat16",
        "sideways:bfloat16:1024",
        "fwd:int8:1024",
        "bwd:float32:0",
        "bwd:float32:70000",
        "fwd:float32:ten",
    ],
)
def test_launch_rules_refuses_a_bad_item_in_one_line_before_any_work(items, capsys):
    assert launch_rules.main(["--items", f"fwd:float32:1024,{items}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(items) in err[0] and "accepted: kind:dtype:N" in err[0]


def test_launch_rules_parses_the_default_items():
    items = launch_rules.parse_items(",".join(launch_rules.DEFAULT_ITEMS))
    assert len(items) == len(launch_rules.DEFAULT_ITEMS) and ("bwd", "bfloat16", 16384) in items


def _as_if_on_a_gpu(monkeypatch, records_then_interrupt=None):
    """launch_rules' main past its GPU check, with run_item replaced by a fake."""
    monkeypatch.setattr(launch_rules, "backend", lambda: launch_rules.CUDA)
    monkeypatch.setattr(launch_rules.torch.cuda, "empty_cache", lambda: None)

    def fake_run_item(kind, dtype_name, n, device, bench):
        for i in range(2):
            yield dict(kind=kind, dtype=dtype_name, N=n, variant=f"v{i}", ok=True, ms=1.0, frac=0.5)
        if records_then_interrupt:
            raise KeyboardInterrupt

    monkeypatch.setattr(launch_rules, "run_item", fake_run_item)


def test_launch_rules_interrupted_keeps_every_record_and_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    _as_if_on_a_gpu(monkeypatch, records_then_interrupt=True)
    out = tmp_path / "rules.jsonl"
    out.write_text('{"earlier": true}\n')  # a rerun appends: the earlier run's records stay
    assert launch_rules.main(["--items", "fwd:bfloat16:3072", "--json", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and str(out) in err[0]
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and lines[0] == '{"earlier": true}' and '"variant": "v1"' in lines[2]


def test_launch_rules_refuses_a_json_path_it_cannot_write_in_one_line(tmp_path, monkeypatch, capsys):
    _as_if_on_a_gpu(monkeypatch)
    (tmp_path / "a-file").write_text("")
    assert launch_rules.main(["--items", "fwd:bfloat16:3072", "--json", str(tmp_path / "a-file" / "rules.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a-file is a file, not a folder" in err[0]


@pytest.mark.parametrize(
    "script, argv",
    [
        (launch_sweep, ["--samples", "0"]),
        (launch_sweep, ["--warmup", "-1"]),
        (host_time, ["--calls", "0"]),
        (train_step, ["--warmup", "0"]),
    ],
    ids=lambda v: v.__name__ if hasattr(v, "__name__") else " ".join(v),
)
def test_a_count_below_its_minimum_is_refused_in_one_line_before_any_work(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {argv[0]}: {argv[1]} is too small" in err[0]


def test_launch_sweep_writes_its_rows_with_their_plans(tmp_path, monkeypatch, capsys, device):
    """main past its GPU check, on the CPU, with a fake timer and ceiling: the JSON holds every row."""
    monkeypatch.setattr(launch_sweep, "backend", lambda: launch_sweep.CUDA)
    monkeypatch.setattr(launch_sweep.torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(launch_sweep.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(launch_sweep, "copy_ceiling", lambda: 2e12)
    monkeypatch.setattr(launch_sweep, "cuda_timer", lambda *a, **k: FasterEachTime())
    monkeypatch.setattr(launch_sweep, "SHAPES", {(40, 257, "float32"): ("narrow_off",)})
    real_run_sweep = launch_sweep.run_sweep
    monkeypatch.setattr(launch_sweep, "run_sweep", lambda shapes, dev, *a: real_run_sweep(shapes, device, *a))
    assert launch_sweep.main(["--json", str(tmp_path / "out" / "sweep.json")]) == 0
    data = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert data["device"] == "fake GPU" and data["ceiling_tbps"] == pytest.approx(2.0)
    assert [(r["impl"], r["mode"]) for r in data["rows"]] == [
        ("base", FWD),
        ("base", FWD_BWD),
        ("narrow_off", FWD),
        ("narrow_off", FWD_BWD),
    ]
    assert all(r["ok"] and r["plan"] for r in data["rows"])
    assert "narrow_off" in capsys.readouterr().out


@pytest.mark.slow
@no_gpu_only
@pytest.mark.parametrize("name", ["launch_rules", "launch_sweep", "host_time", "train_step"])
def test_each_script_runs_as_a_module_and_says_it_needs_a_gpu(name):
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr.strip().splitlines()[-1]
