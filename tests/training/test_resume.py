"""Exact resume, crash-safe checkpoints, bad checkpoint files and reproducible runs, through train.py."""

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.checkpoints import CheckpointError, atomic_torch_save, read_checkpoint
from rmsnorm_kernel.events import read_scalars

from .test_training import ROOT, train

QUIET = ["trainer.enable_progress_bar=false"]


def final_state(tmp_path, impl):
    (path,) = (tmp_path / "checkpoints" / f"{impl}_seed0").glob("version_*/final.ckpt")
    return read_checkpoint(path)


def assert_same_tree(a, b, where="checkpoint"):
    """Every tensor bit-identical (torch.equal), every other value equal, the same keys."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def scalars_of(tmp_path, impl):
    (run,) = (tmp_path / "runs" / f"{impl}_seed0").glob("version_*")
    return read_scalars(run)


KILL_AT_STEP = (
    "import os\n"
    "from rmsnorm_kernel.model import RMSNormRegressor\n"
    "_end = RMSNormRegressor.on_train_batch_end\n"
    "def on_train_batch_end(self, *a):\n"
    "    _end(self, *a)\n"
    "    if self.global_step == {step}:\n"
    "        os._exit(9)  # a crash right after the step's checkpoint: no cleanup of any kind\n"
    "RMSNormRegressor.on_train_batch_end = on_train_batch_end\n"
)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_run_interrupted_mid_epoch_and_resumed_ends_bit_identical(tmp_path, impl):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir(), broken.mkdir()
    common = [f"norm={impl}", "checkpoint.every_n_steps=37"]
    assert train(whole, *common).returncode == 0
    crashed = train(broken, *common, prelude=KILL_AT_STEP.format(step=37))
    assert crashed.returncode == 9  # stopped at step 37 of 100, in the first epoch of 64 batches
    resumed = train(broken, *common, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a, b = final_state(whole, impl), final_state(broken, impl)
    assert a["global_step"] == b["global_step"] == 100
    assert_same_tree(a["state_dict"], b["state_dict"], "state_dict")
    assert_same_tree(a["optimizer_states"], b["optimizer_states"], "optimizer_states")  # Adam's moments and steps
    sa, sb = scalars_of(whole, impl), scalars_of(broken, impl)
    assert [s for s, _ in sb["train/mse"]] == list(range(100))  # one value per step, none lost or doubled
    assert sa["train/mse"] == sb["train/mse"]
    assert sa["calls/forward"] == sb["calls/forward"]
    assert sa["val/mse"] == sb["val/mse"] and sa["test/mse"] == sb["test/mse"]


def test_two_runs_with_the_same_configuration_are_bit_identical(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    args = ["-m", "norm=reference,triton", "trainer.max_steps=12", "trainer.val_check_interval=4", "checkpoint.every_n_steps=6"]
    assert train(first, *args).returncode == 0
    assert train(second, *args).returncode == 0
    for impl in ("reference", "triton"):
        a, b = final_state(first, impl), final_state(second, impl)
        assert_same_tree(a["state_dict"], b["state_dict"])
        assert_same_tree(a["optimizer_states"], b["optimizer_states"])
        sa, sb = scalars_of(first, impl), scalars_of(second, impl)
        sa.pop("reload/max_abs_diff"), sb.pop("reload/max_abs_diff")
        assert sa == sb


def test_sigkill_at_random_moments_never_leaves_a_bad_checkpoint(tmp_path):
    """Kill a real training process repeatedly (checkpoints every 2 steps), resume from last each time."""
    reference_dir, killed_dir = tmp_path / "whole", tmp_path / "killed"
    reference_dir.mkdir(), killed_dir.mkdir()
    args = ["trainer.max_steps=40", "checkpoint.every_n_steps=2", "trainer.val_check_interval=10", *QUIET]
    assert train(reference_dir, *args).returncode == 0
    rng = random.Random(2026)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    kills = 0
    for attempt in range(12):
        resume = ["ckpt_path=last"] if list(killed_dir.glob("checkpoints/*/*/last.ckpt")) else []
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args, *resume],
            cwd=killed_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        if kills < 3:
            # wait for training to start writing checkpoints, then kill at a random moment
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                ckpts = list(killed_dir.glob("checkpoints/*/*/*.ckpt"))
                if len(ckpts) > 2 * kills + 1:
                    break
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                for ckpt in killed_dir.glob("checkpoints/*/*/*.ckpt"):
                    read_checkpoint(ckpt)  # every file in place is complete, at every kill
                continue
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        break
    assert kills == 3
    for ckpt in killed_dir.glob("checkpoints/*/*/*.ckpt"):
        read_checkpoint(ckpt)
    a, b = final_state(reference_dir, "triton"), final_state(killed_dir, "triton")
    assert_same_tree(a["state_dict"], b["state_dict"])
    assert_same_tree(a["optimizer_states"], b["optimizer_states"])


def test_atomic_save_interrupted_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"v": torch.arange(4)}, path)
    before = path.read_bytes()

    def dies_half_way(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the process is stopped while writing

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"v": torch.arange(8)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


@pytest.fixture(scope="module")
def good_checkpoints(tmp_path_factory):
    """A short run of each path; returns the folder holding runs/ and checkpoints/."""
    d = tmp_path_factory.mktemp("good")
    proc = train(d, "-m", "norm=reference,triton", "trainer.max_steps=3", "checkpoint.every_n_steps=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


def make_bad(kind, d, good):
    bad = d / f"{kind}.ckpt"
    data = good.read_bytes()
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "corrupted":
        mid = len(data) // 2
        bad.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + 4096]) + data[mid + 4096 :])
    elif kind == "foreign":
        torch.save({"model": torch.zeros(3)}, bad)
    elif kind == "code":
        bad.write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")  # a bare pickle that would run a command
    elif kind == "unsafe":
        torch.save({"state_dict": {}, "payload": argparse.Namespace(a=1)}, bad)  # a class weights_only refuses
    return bad


@pytest.mark.parametrize(
    "kind,message",
    [
        ("missing", "does not exist"),
        ("empty", "is empty (0 bytes)"),
        ("truncated", "is truncated or corrupted and cannot be read"),
        ("corrupted", "is corrupted (record "),
        ("foreign", "is not a full training checkpoint of this project (missing: state_dict"),
        ("code", "is truncated or corrupted and cannot be read"),
        ("unsafe", "is truncated or corrupted and cannot be read (Weights only load failed"),
    ],
)
def test_bad_checkpoint_file_gives_one_line_and_changes_nothing(tmp_path, good_checkpoints, kind, message):
    (good,) = (good_checkpoints / "checkpoints" / "triton_seed0").glob("version_*/last.ckpt")
    bad = tmp_path / "missing.ckpt" if kind == "missing" else make_bad(kind, tmp_path, good)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    proc = train(tmp_path, f"ckpt_path={bad}")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"train.py: checkpoint error: checkpoint {bad} {message}" or last.startswith(
        f"train.py: checkpoint error: checkpoint {bad} {message}"
    )
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "outputs" not in p.parts} == before
    assert not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["norm=triton"], "was trained with norm path = 'reference'; the configuration asks for 'triton'"),
        (["norm=reference", "model.hidden_dim=128"], "was trained with hidden_dim = 257; the configuration asks for 128"),
        (["norm=reference", "data.batch_size=16"], "was trained with batch_size = 32; the configuration asks for 16"),
    ],
)
def test_checkpoint_of_another_configuration_is_refused(tmp_path, good_checkpoints, overrides, message):
    (ref,) = (good_checkpoints / "checkpoints" / "reference_seed0").glob("version_*/last.ckpt")
    before = ref.read_bytes()
    proc = train(tmp_path, f"ckpt_path={ref}", *overrides)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"train.py: checkpoint error: checkpoint {ref} {message}"
    assert ref.read_bytes() == before


def test_ckpt_path_last_without_a_previous_run_is_refused(tmp_path):
    proc = train(tmp_path, "ckpt_path=last")
    assert proc.returncode == 2
    assert "ckpt_path=last:" in proc.stderr and "holds no last.ckpt" in proc.stderr


def test_non_finite_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    proc = train(tmp_path, "model.lr=1e30", "checkpoint.every_n_steps=1", "trainer.max_steps=20")
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("train.py: training stopped: train/mse is ") and " at step " in line
    step = int(line.split(" at step ")[1].split(",")[0])
    kept = Path(line.split("the last good checkpoint is ")[1])
    ckpt = read_checkpoint(kept)
    assert ckpt["global_step"] == step
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


def test_read_checkpoint_refuses_a_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is not a file"):
        read_checkpoint(tmp_path)
