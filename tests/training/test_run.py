"""``train.py`` end to end: both paths, the TensorBoard tags read back, counters, parity, reload, errors."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from rmsnorm_kernel.tolerances import TRAINING_CURVE_RTOL
from rmsnorm_kernel.events import read_scalars
from rmsnorm_kernel.training import build

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["trainer.enable_progress_bar=false"]


def compose_cfg(overrides=()):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train(tmp_path, *overrides, prelude=None):
    """Runs train.py in tmp_path with runs/ and checkpoints/ there; returns the completed process."""
    args = [*overrides, *QUIET]
    if prelude is None:
        cmd = [sys.executable, str(ROOT / "train.py"), *args]
    else:  # patch the package first, then run train.py as __main__
        code = f"{prelude}\nimport runpy, sys\nsys.argv = {[str(ROOT / 'train.py'), *args]!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')"
        cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_dirs(tmp_path):
    return {p.parent.name.split("_")[0]: p for p in sorted((tmp_path / "runs").glob("*_seed*/version_*"))}


def test_same_seed_gives_identical_initial_weights_and_batches_on_both_paths():
    (m_ref, d_ref), (m_tri, d_tri) = (build(compose_cfg([f"norm={n}", "seed=5"])) for n in ("reference", "triton"))
    assert m_ref.net.norm.impl == "reference" and m_tri.net.norm.impl == "triton"
    ref_state, tri_state = m_ref.state_dict(), m_tri.state_dict()
    assert ref_state.keys() == tri_state.keys()
    assert all(torch.equal(ref_state[k], tri_state[k]) for k in ref_state)
    for (xa, ya), (xb, yb) in zip(d_ref.train_dataloader(), d_tri.train_dataloader()):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # and another seed gives other weights: the comparison above can fail
    other, _ = build(compose_cfg(["seed=6"]))
    assert not torch.equal(other.state_dict()["net.inp.weight"], ref_state["net.inp.weight"])


def check_two_path_run(tmp_path, proc, steps, val_every):
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = run_dirs(tmp_path)
    assert set(runs) == {"reference", "triton"}
    scalars = {impl: read_scalars(d) for impl, d in runs.items()}
    for impl, s in scalars.items():
        assert [step for step, _ in s["train/mse"]] == list(range(steps)), impl
        assert len(s["val/mse"]) == steps // val_every
        assert len(s["test/mse"]) == 1
        for tag in ("parity/initial_output_err", "parity/initial_grad_err"):
            assert s[tag][0][0] == 0 and s[tag][0][1] < 1e-4
        assert s["reload/max_abs_diff"] == [(steps, 0.0)]
        expected_calls = steps if impl == "triton" else 0
        assert s["calls/forward"][-1] == (steps - 1, expected_calls)
        assert s["calls/backward"][-1] == (steps - 1, expected_calls)
        assert s["calls/fallback"][-1] == (steps - 1, 0.0)
    # the Triton path counts one call per step, step after step
    assert [v for _, v in scalars["triton"]["calls/forward"]] == list(range(1, steps + 1))
    # the two paths train the same network
    for (_, a), (_, b) in zip(scalars["reference"]["train/mse"], scalars["triton"]["train/mse"]):
        assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL)
    summary = list((tmp_path / "runs").glob("summary_*.md"))
    assert len(summary) == 1
    text = summary[0].read_text()
    assert "reference_seed0" in text and "triton_seed0" in text and "test/mse difference" in text
    for impl in ("reference", "triton"):
        ckpts = list((tmp_path / "checkpoints" / f"{impl}_seed0").glob("version_*/final.ckpt"))
        assert len(ckpts) == 1
    return scalars


def test_two_path_multirun_logs_every_tag_and_passes_its_checks(tmp_path):
    proc = train(tmp_path, "-m", "norm=reference,triton", "trainer.max_steps=12", "trainer.val_check_interval=4", "checkpoint.every_n_steps=6")
    check_two_path_run(tmp_path, proc, steps=12, val_every=4)
    assert "run triton_seed0: OK" in proc.stdout and "run reference_seed0: OK" in proc.stdout


def test_hparams_record_the_backend_with_test_mse_as_metric(tmp_path):
    proc = train(tmp_path, "trainer.max_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dirs(tmp_path)["triton"]))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["backend"].string_value in ("cuda", "interpreter")
    assert session.hparams["norm.impl"].string_value == "triton"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["test/mse"]


def test_default_schedule_two_path_run_completes(tmp_path):
    proc = train(tmp_path, "-m", "norm=reference,triton")
    scalars = check_two_path_run(tmp_path, proc, steps=100, val_every=25)
    assert scalars["triton"]["calls/forward"][-1][1] == 100


@pytest.mark.parametrize("option", ["compile=true", "trainer.precision=bf16-mixed"])
def test_compile_and_mixed_precision_train_on_both_paths(tmp_path, option):
    proc = train(tmp_path, "-m", "norm=reference,triton", option, "trainer.max_steps=4", "trainer.val_check_interval=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = {impl: read_scalars(d) for impl, d in run_dirs(tmp_path).items()}
    assert scalars["triton"]["calls/forward"][-1][1] == 4
    assert scalars["triton"]["reload/max_abs_diff"][0][1] == 0.0


def test_a_wrong_kernel_fails_the_run_with_one_clear_line(tmp_path):
    prelude = (
        "import rmsnorm_kernel.kernels as k, rmsnorm_kernel.mutants as m\n"
        "k.rmsnorm_forward = m.forward_block_mean  # divides by BLOCK: wrong at N = 257"
    )
    proc = train(tmp_path, "trainer.max_steps=2", prelude=prelude)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("train.py: check failed: initial parity: outputs differ by")


@pytest.mark.parametrize(
    "override,code,message",
    [
        ("trainer.max_steps=-5", 2, "train.py: configuration error: trainer.max_steps is -5; accepted: an integer >= 1"),
        ("data.batch_size=0", 2, "train.py: configuration error: data.batch_size is 0; accepted: an integer >= 1"),
        ("trainer.max_steps=many", 1, "full_key: trainer.max_steps"),
        ("norm=cuda", 1, "Available options in 'norm':"),
    ],
)
def test_bad_configuration_fails_before_any_work(tmp_path, override, code, message):
    proc = train(tmp_path, override)
    assert proc.returncode == code
    assert message in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()


def test_fallback_to_the_reference_is_counted_in_tensorboard(tmp_path):
    from rmsnorm_kernel.contract import MAX_N

    # rows one element longer than the kernels take: every training call falls back, and says so
    proc = train(tmp_path, "norm.fallback=reference", f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "using the reference path (fallback='reference')" in proc.stderr + proc.stdout
    s = read_scalars(run_dirs(tmp_path)["triton"])
    assert [v for _, v in s["calls/fallback"]] == [1.0, 2.0, 3.0]
    assert [v for _, v in s["calls/forward"]] == [0.0, 0.0, 0.0]


def test_without_fallback_a_refused_shape_stops_the_run_with_the_contract_message(tmp_path):
    from rmsnorm_kernel.contract import MAX_N

    proc = train(tmp_path, f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=3")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: training stopped: rmsnorm (triton): x has rows of")
    assert f"accepted: N <= {MAX_N}" in last and "norm.fallback=reference" in last
