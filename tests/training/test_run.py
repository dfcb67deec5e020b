"""One run in this process: every path, the TensorBoard tags read back, the end-of-run checks.

The end-to-end command, ``train.py -m norm=reference,native,triton`` on its default schedule, is the slow test.
"""

import logging
import math
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rmsnorm_kernel.checks.checkpoint_audit import audit_checkpoint
from rmsnorm_kernel.ops import launchers
from rmsnorm_kernel.ops import module as norm_module
from rmsnorm_kernel.ops.contract import MAX_N, ContractError
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.reference import rmsnorm_reference
from rmsnorm_kernel.ops.tolerances import TOLERANCES, TRAINING_CURVE_RTOL
from rmsnorm_kernel.training.checkpoints import read_checkpoint
from rmsnorm_kernel.training.events import read_scalars
from rmsnorm_kernel.training.network import build_network
from rmsnorm_kernel.training.parity import COMPARED, PathVerdict, parity_name, parity_tag
from rmsnorm_kernel.training.result import RunResult
from rmsnorm_kernel.training.run import build
from rmsnorm_kernel.training.verdicts import failed_checks
from tests.helpers import DEVICE, compose_cfg, markdown_rows, train_process

from .helpers import (
    assert_same_tree,
    block_mean_forward,
    checkpoint_of,
    rerun_recorded_outputs,
    run_dirs,
    scalars_of,
    shared_run,
    train,
)

STEPS, VAL_EVERY, PARITY_EVERY, WINDOW = 4, 2, 2, 2  # the tiny schedule of helpers.TINY


@pytest.fixture(scope="module")
def all_paths(tmp_path_factory):
    return {impl: shared_run(tmp_path_factory, f"norm={impl}") for impl in IMPLS}


def test_same_seed_gives_identical_initial_weights_and_batches_on_every_path():
    built = {n: build(compose_cfg([f"norm={n}", "seed=5"])) for n in IMPLS}
    (m_ref, d_ref) = built["reference"]
    ref_state = m_ref.state_dict()
    for impl, (module, data) in built.items():
        assert module.net.norm.impl == impl
        state = module.state_dict()
        assert state.keys() == ref_state.keys()
        assert all(torch.equal(ref_state[k], state[k]) for k in ref_state), impl
        for (xa, ya), (xb, yb) in zip(d_ref.train_dataloader(), data.train_dataloader()):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # and another seed gives other weights: the comparison above can fail
    other, _ = build(compose_cfg(["seed=6"]))
    assert not torch.equal(other.state_dict()["net.inp.weight"], ref_state["net.inp.weight"])


def check_scalars(s, impl, steps, val_every, parity_every, window):
    """The tags a run of ``steps`` steps on the ``impl`` path logs (shared with the slow end-to-end test).
    Per-step scalars are logged at the 0-based index of the step they follow, as train/mse is; parity at
    the step about to run; test/mse, reload/max_abs_diff and time/run_s at the number of steps."""
    assert [step for step, _ in s["train/mse"]] == list(range(steps)), impl
    # every val_every steps, and at the last step whatever the schedule
    assert [step for step, _ in s["val/mse"]] == sorted({*range(val_every - 1, steps, val_every), steps - 1})
    assert len(s["test/mse"]) == 1
    checks = list(range(0, steps, parity_every))  # step 0, then every parity_every steps
    for path in COMPARED:  # each compared with the reference, whichever path trained: parity/native_... too
        for name in ("initial_output_err", "initial_grad_err"):
            tag = parity_tag(path, name)
            assert len(s[tag]) == 1 and s[tag][0][0] == 0 and 0.0 <= s[tag][0][1] <= TOLERANCES[torch.float32].rtol
        for name in ("output_err", "grad_err", "worst_over_tol"):
            assert [step for step, _ in s[parity_tag(path, name)]] == checks, (path, name)
        assert all(0.0 <= v <= 1.0 for _, v in s[parity_tag(path, "worst_over_tol")])
    assert {"parity/native_output_err", "parity/native_grad_err", "parity/native_worst_over_tol"} <= s.keys()
    assert [step for step, _ in s["calls/parity_forward"]] == checks
    # every path's parity checks run the Triton copy once forward and once backward, counted apart
    assert [v for _, v in s["calls/parity_forward"]] == [float(i + 1) for i in range(len(checks))]
    assert [v for _, v in s["calls/parity_backward"]] == [float(i + 1) for i in range(len(checks))]
    assert [step for step, _ in s["time/step_ms"]] == sorted({*range(window - 1, steps, window), steps - 1})
    assert all(v > 0 for _, v in s["time/step_ms"])
    if DEVICE == "cuda":  # the norm's GPU time in each window, a part of the step's
        assert [step for step, _ in s["time/rmsnorm_ms"]] == [step for step, _ in s["time/step_ms"]]
        assert all(0 < norm < whole for (_, norm), (_, whole) in zip(s["time/rmsnorm_ms"], s["time/step_ms"]))
    else:
        assert "time/rmsnorm_ms" not in s  # no GPU, no GPU time
    assert s["reload/max_abs_diff"] == [(steps, 0.0)]
    assert len(s["time/run_s"]) == 1 and s["time/run_s"][0][0] == steps and s["time/run_s"][0][1] > 0
    expected_calls = steps if impl == "triton" else 0
    assert s["calls/forward"][-1] == (steps - 1, expected_calls)
    assert s["calls/backward"][-1] == (steps - 1, expected_calls)
    assert s["calls/fallback"][-1] == (steps - 1, 0.0)
    # read without waiting for the device every step: logged at least at each window's end and the last step
    assert {*range(window - 1, steps, window), steps - 1} <= {step for step, _ in s["calls/forward"]}
    if impl == "triton":  # one call per step, step after step
        assert all(v == step + 1 for step, v in s["calls/forward"] + s["calls/backward"])


def check_curves_agree(scalars):
    """Every path trains the same network: its train/mse curve agrees with the reference's step by step."""
    for impl in IMPLS:
        pairs = list(zip(scalars["reference"]["train/mse"], scalars[impl]["train/mse"]))
        assert len(pairs) == len(scalars[impl]["train/mse"]) > 0
        for (_, a), (_, b) in pairs:
            assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL), impl


def test_every_path_passes_its_checks_and_logs_every_tag(all_paths):
    scalars = {}
    for impl, (root, result) in all_paths.items():
        assert result.ok, result.failures
        assert (result.impl, result.steps, result.name) == (impl, STEPS, f"{impl}_seed0")
        expected = STEPS if impl == "triton" else 0
        assert (result.calls["train/forward"], result.calls["train/backward"], result.calls["train/fallback"]) == (
            expected,
            expected,
            0,
        )
        scalars[impl] = read_scalars(result.log_dir)
        check_scalars(scalars[impl], impl, STEPS, VAL_EVERY, PARITY_EVERY, WINDOW)
        assert result.metrics["reload/max_abs_diff"] == 0.0
        assert result.metrics["test/mse"] == scalars[impl]["test/mse"][0][1]
        final, last = read_checkpoint(result.checkpoint), read_checkpoint(checkpoint_of(root, impl, "last.ckpt"))
        assert final["global_step"] == STEPS
        assert_same_tree(final["state_dict"], last["state_dict"])  # ckpt_path=last resumes the final state
    check_curves_agree(scalars)
    assert len({result.initial_weights_sha256 for _, result in all_paths.values()}) == 1


def test_a_native_run_records_the_parity_of_every_path_in_its_result_and_checkpoints(all_paths):
    root, result = all_paths["native"]
    assert result.ok and result.impl == "native"
    parity = read_checkpoint(result.checkpoint)["callbacks"]["Parity"]
    assert {"native_output_err", "native_grad_err", "native_ok", "native_worst_over_tol"} <= parity.keys()
    assert parity["checked_steps"] == list(range(0, STEPS, PARITY_EVERY))
    for path in COMPARED:
        verdict = PathVerdict(**{f.name: parity[parity_name(path, f.name)] for f in fields(PathVerdict)})
        assert verdict.ok and verdict.failed_steps == [] and verdict.unknown_before is None, path
        assert 0.0 <= verdict.worst_over_tol <= 1.0, path
        assert result.metrics[parity_tag(path, "initial_output_err")] == verdict.output_err
        assert result.metrics[parity_tag(path, "initial_grad_err")] == verdict.grad_err
        assert result.metrics[parity_tag(path, "worst_over_tol")] == verdict.worst_over_tol
        logged = read_scalars(result.log_dir)[parity_tag(path, "worst_over_tol")]
        assert max(v for _, v in logged) == pytest.approx(verdict.worst_over_tol, rel=1e-6)  # TensorBoard's float32


@pytest.mark.parametrize("impl", IMPLS)
def test_every_checkpoint_reproduces_its_recorded_outputs_bit_for_bit_where_the_kernels_run(all_paths, impl):
    root, _ = all_paths[impl]
    paths = sorted((root / "checkpoints").glob(f"{impl}_seed0/version_*/*.ckpt"))
    assert [p.name for p in paths] == ["final.ckpt", "last.ckpt", "step00002.ckpt", "step00004.ckpt"]
    for path in paths:
        now, recorded = rerun_recorded_outputs(read_checkpoint(path))
        assert recorded.shape == (32, 16)  # the whole tiny test split (up to 64 rows are recorded)
        assert torch.equal(now, recorded), path.name


def test_hparams_record_the_backend_with_the_mses_and_the_run_time_as_metrics(all_paths):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(all_paths["triton"][1].log_dir)
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["backend"].string_value in ("cuda", "interpreter")
    assert session.hparams["norm.impl"].string_value == "triton"
    assert session.hparams["trainer.max_steps"].number_value == STEPS
    assert session.hparams["compile"].WhichOneof("kind") == "bool_value"  # a boolean, not 0.0000
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert experiment.hparam_infos[0].name == "norm.impl" and experiment.hparam_infos[0].differs
    assert [m.name.tag for m in experiment.metric_infos] == ["train/mse", "val/mse", "test/mse", "time/run_s"]


def test_a_triton_path_that_never_runs_fails_the_integration_check(tmp_path, monkeypatch):
    monkeypatch.setattr(norm_module, "rmsnorm", rmsnorm_reference)  # the module quietly computes the reference
    result = train(tmp_path, "norm=triton")
    assert result.failures == [
        "integration: 0 Triton forward calls in 4 training steps on the triton path; expected 4",
        "integration: 0 Triton backward calls in 4 training steps on the triton path; expected 4",
    ]


def test_a_wrong_kernel_fails_initial_parity_naming_the_declared_tolerance(tmp_path, monkeypatch):
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    result = train(tmp_path, "norm=triton", "trainer.max_steps=1")
    assert not result.ok
    first = result.failures[0]
    assert first.startswith("initial parity: triton outputs differ from the reference by ")
    assert first.endswith(", beyond the float32 tolerance (atol 1e-05, rtol 0.0001)")


def test_failed_checks_name_each_failure():
    cfg = compose_cfg(["norm=triton"])
    result = RunResult(
        name="triton_seed0",
        impl="triton",
        seed=0,
        backend="interpreter",
        steps=10,
        checkpoint="c/final.ckpt",
        calls={"train/forward": 8, "train/backward": 8, "train/fallback": 2},
    )
    kernel = PathVerdict(ok=False, output_err=0.5, grad_err=0.25, failed_steps=[0])  # step 0 alone: the initial check
    parity = SimpleNamespace(dtype=torch.bfloat16, paths={"triton": kernel, "native": PathVerdict()})
    assert failed_checks(cfg, result, parity, 0.125, "reference") == [
        "initial parity: triton outputs differ from the reference by 0.5, gradients by 0.25, "
        "beyond the bfloat16 tolerance (atol 0.0234375, rtol 0.0234375)",
        "reload parity: test outputs differ by 0.125 after reloading c/final.ckpt (must be 0)",
        "reload parity: c/final.ckpt reloaded with norm 'reference', trained with 'triton'",
    ]  # 8 + 2 fallbacks = 10 steps: the integration check passes
    parity.paths["triton"] = PathVerdict()
    parity.paths["native"] = PathVerdict(ok=False, output_err=0.5, grad_err=0.25, failed_steps=[0, 5])
    result.calls["train/fallback"] = 0
    assert failed_checks(cfg, result, parity, 0.0, "triton") == [
        "parity along the run: native past the tolerance at step 5",
        "initial parity: native outputs differ from the reference by 0.5, gradients by 0.25, "
        "beyond the bfloat16 tolerance (atol 0.0234375, rtol 0.0234375)",
        "integration: 8 Triton forward calls in 10 training steps on the triton path; expected 10",
        "integration: 8 Triton backward calls in 10 training steps on the triton path; expected 10",
    ]


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_the_integration_check_expects_no_triton_call_on_the_other_paths(impl):
    cfg = compose_cfg([f"norm={impl}"])
    parity = SimpleNamespace(dtype=torch.float32, paths={path: PathVerdict() for path in COMPARED})
    calls = {"train/forward": 0, "train/backward": 0, "train/fallback": 0}
    result = RunResult(name=f"{impl}_seed0", impl=impl, seed=0, backend="interpreter", steps=10, calls=calls)
    assert failed_checks(cfg, result, parity, 0.0, impl) == []
    result.calls.update({"train/forward": 10, "train/backward": 10})  # as a Triton run would have called them
    assert failed_checks(cfg, result, parity, 0.0, impl) == [
        f"integration: 10 Triton forward calls in 10 training steps on the {impl} path; expected 0",
        f"integration: 10 Triton backward calls in 10 training steps on the {impl} path; expected 0",
    ]


def test_fallback_to_the_reference_is_counted_in_tensorboard(tmp_path, caplog):
    # rows one element longer than the kernels take: every training call falls back, and says so
    with caplog.at_level(logging.WARNING, logger="rmsnorm_kernel"):
        result = train(tmp_path, "norm.fallback=reference", f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=3")
    # every step fell back as allowed, and the integration check says no step ran on Triton
    assert result.failures == [
        "integration: no training step ran on Triton: 3 of 3 norm calls in 3 steps fell back to the reference "
        "(first reason: "
        f"rmsnorm (triton): x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N})"
    ]
    assert "using the reference path (fallback='reference')" in caplog.text
    s = read_scalars(run_dirs(tmp_path)["triton"])
    assert s["calls/fallback"][-1] == (2, 3.0)
    assert all(v == step + 1 for step, v in s["calls/fallback"])  # every step so far fell back
    assert all(v == 0.0 for _, v in s["calls/forward"])


def test_without_fallback_a_refused_shape_stops_the_run_with_the_contract_message(tmp_path):
    with pytest.raises(ContractError, match=f"x has rows of N = {MAX_N + 1} elements.*accepted: N <= {MAX_N}"):
        train(tmp_path, f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=3")


@pytest.mark.parametrize("option", ["compile=true", "trainer.precision=bf16-mixed", "trainer.precision=bf16-true"])
@pytest.mark.parametrize("impl", IMPLS)
def test_compile_and_reduced_precision_train_on_every_path(tmp_path, impl, option):
    result = train(tmp_path, f"norm={impl}", option)
    assert result.ok, result.failures  # parity included: every path within the tolerance of its dtype
    if option == "trainer.precision=bf16-true":  # the whole network in bfloat16, reloaded and audited as such
        ckpt = torch.load(result.checkpoint, map_location="cpu", weights_only=True)
        assert ckpt["hyper_parameters"]["dtype"] == "bfloat16"
        assert all(t.dtype == torch.bfloat16 for t in ckpt["state_dict"].values())
        audit = audit_checkpoint(Path(result.checkpoint), build_network)
        assert audit.ok and audit.stage == "verified", audit.detail
    assert result.metrics["parity/checks"] == len(range(0, STEPS, PARITY_EVERY))
    s = read_scalars(result.log_dir)
    assert s["calls/forward"][-1][1] == (STEPS if impl == "triton" else 0)
    assert s["reload/max_abs_diff"] == [(STEPS, 0.0)]
    if option == "compile=true":  # the norm is inside a compiled graph: not timed on its own
        assert "time/rmsnorm_ms" not in s and "time/step_ms" in s


@pytest.mark.slow
def test_the_three_path_command_on_its_default_schedule_passes_its_checks(tmp_path):
    """``train.py -m norm=reference,native,triton``, the main command, as documented: 100 steps, validation
    every 25."""
    proc = train_process(tmp_path, "-m", "norm=reference,native,triton")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for impl in IMPLS:
        assert f"run {impl}_seed0: OK" in proc.stdout
    runs = run_dirs(tmp_path)
    assert set(runs) == set(IMPLS)
    scalars = {impl: read_scalars(d) for impl, d in runs.items()}
    for impl, s in scalars.items():
        check_scalars(s, impl, steps=100, val_every=25, parity_every=25, window=10)
    check_curves_agree(scalars)
    (summary,) = (tmp_path / "runs").glob("summary_*.md")
    text = summary.read_text()
    assert ["", "reference_seed0", "native_seed0", "triton_seed0"] in markdown_rows(text)
    assert "triton_seed0 against native_seed0: median step " in text
    assert "triton_seed0 against reference_seed0: median step " in text
    assert (tmp_path / "runs" / summary.name.replace(".md", ".json")).exists()
    for impl in IMPLS:
        ckpts = sorted(p.name for p in (tmp_path / "checkpoints" / f"{impl}_seed0").glob("version_*/*.ckpt"))
        assert ckpts == ["final.ckpt", "last.ckpt", "step00050.ckpt", "step00100.ckpt"]


def test_a_run_validates_at_its_last_step_and_so_does_its_continuation(tmp_path):
    # validation every 2 steps; 3 and 5 steps are not multiples of it (the schedule does not depend on
    # the norm's path: the reference path)
    assert train(tmp_path, "norm=reference", "trainer.max_steps=3").ok
    assert [step for step, _ in scalars_of(tmp_path, "reference")["val/mse"]] == [1, 2]
    assert train(tmp_path, "norm=reference", "trainer.max_steps=5", "ckpt_path=last").ok  # a branch of the ended run
    branch = read_scalars(tmp_path / "runs/reference_seed0/version_1")
    assert [step for step, _ in branch["val/mse"]] == [3, 4]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_large_preset_trains_on_every_path_at_a_reduced_size(tmp_path, impl):
    # the preset itself is for a GPU; here its network at 96 features and 16 rows a step
    result = train(tmp_path, f"norm={impl}", "model=large", "model.hidden_dim=96", "data.batch_size=16")
    assert result.ok, result.failures
    assert result.name == f"{impl}_seed0_hidden96" and result.steps == STEPS


def test_each_run_folder_carries_the_comparison_layout_and_its_charts_name_logged_tags(all_paths):
    import re

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    for impl, (_, result) in all_paths.items():
        acc = EventAccumulator(result.log_dir)
        acc.Reload()
        (event,) = acc.Tensors("custom_scalars__config__")  # where TensorBoard's custom-scalars plugin reads it
        (category,) = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0]).category
        charts = {c.title: list(c.multiline.tag) for c in category.chart}
        assert list(charts) == [
            "train/mse",
            "val/mse",
            "parity: largest |difference| of outputs and gradients from the reference",
            "parity: worst difference / tolerance (passes at 1 or less)",
            "time/step_ms and time/rmsnorm_ms (medians of each logging window)",
        ]
        tags = read_scalars(result.log_dir)
        unmeasured = {r"^time/rmsnorm_ms$"} if DEVICE == "cpu" else set()  # GPU time: none without a GPU
        drawn = set()
        for title, patterns in charts.items():  # every pattern draws a tag the run logged
            for pattern in set(patterns) - unmeasured:
                matched = [t for t in tags if re.search(pattern, t)]
                assert matched, (impl, title, pattern)
                drawn.update(matched)
        for path in COMPARED:  # each compared path's parity curves, and not the initial check's single points
            assert {parity_tag(path, n) for n in ("output_err", "grad_err", "worst_over_tol")} <= drawn, path
        assert not [t for t in drawn if "initial" in t]


@pytest.mark.parametrize(
    ("rank", "env", "zero"),
    [
        (0, {}, True),
        (1, {}, False),
        (0, {"NODE_RANK": "1"}, False),  # Lightning's own launcher: process 0 of machine 1
        (0, {"GROUP_RANK": "1"}, False),  # torchrun's machine 1 (its RANK also says so)
        (0, {"NODE_RANK": "0", "GROUP_RANK": "0"}, True),
    ],
)
def test_only_global_process_0_claims_folders_before_the_trainer_exists(monkeypatch, rank, env, zero):
    from lightning.pytorch.utilities import rank_zero_only

    from rmsnorm_kernel.training.run import process_zero

    monkeypatch.setattr(rank_zero_only, "rank", rank)
    for key in ("NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert process_zero() is zero
