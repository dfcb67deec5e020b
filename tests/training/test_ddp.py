"""Data parallelism through Lightning's DDP: 2 processes of 16 examples train like 1 process of 32.

Two processes on the CPU (gloo) where the kernels run through Triton's interpreter; where they run on
CUDA, two GPUs (NCCL), since the Triton path takes no CPU tensors there. Skipped on a machine with one GPU.
The single-process runs they are compared with train in this process.
"""

import math
import subprocess
import sys

import pytest
import torch

from rmsnorm_kernel.ops.tolerances import TRAINING_CURVE_RTOL, compare
from rmsnorm_kernel.training.checkpoints import read_checkpoint
from rmsnorm_kernel.training.events import read_scalars
from tests.helpers import QUIET, ROOT, ctrl_c_as_in_a_terminal, train_process

from .helpers import DDP, GPUS, checkpoint_of, needs_two_processes, rerun_recorded_outputs, train

STEPS = 16
SCHEDULE = [
    f"trainer.max_steps={STEPS}",
    "trainer.val_check_interval=8",
    "checkpoint.every_n_steps=8",
    "data.train_size=512",
    "data.val_size=64",
    "data.test_size=64",
]
pytestmark = [pytest.mark.slow, needs_two_processes]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both paths, once on 2 processes x 16 examples (train.py) and once on 1 x 32 (in this process)."""
    out = {}
    for impl in ("reference", "triton"):
        d = tmp_path_factory.mktemp(f"ddp_{impl}")
        proc = train_process(d, f"norm={impl}", *SCHEDULE, *DDP, "data.batch_size=16")
        assert proc.returncode == 0, proc.stderr[-3000:]
        out["ddp", impl] = (d, proc)
        d = tmp_path_factory.mktemp(f"single_{impl}")
        assert train(d, f"norm={impl}", *SCHEDULE, "data.batch_size=32").ok
        out["single", impl] = (d, None)
    return out


def final(runs, layout, impl):
    return read_checkpoint(checkpoint_of(runs[layout, impl][0], impl))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_ddp_final_weights_match_the_single_process_run_at_the_same_global_batch(runs, impl):
    ddp, single = final(runs, "ddp", impl), final(runs, "single", impl)
    assert ddp["global_step"] == single["global_step"] == STEPS
    for key, tensor in single["state_dict"].items():
        c = compare(ddp["state_dict"][key], tensor)
        assert c.ok, f"{key}: max abs {c.max_abs:.3g}"


def test_ddp_paths_agree_with_each_other(runs):
    ref, tri = final(runs, "ddp", "reference"), final(runs, "ddp", "triton")
    for key, tensor in ref["state_dict"].items():
        assert compare(tri["state_dict"][key], tensor).ok, key


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_ddp_logs_once_the_global_batch_mse_and_per_process_counters(runs, impl):
    d, proc = runs["ddp", impl]
    run_dirs = list((d / "runs").glob("*/version_*"))
    assert len(run_dirs) == 1  # process 1 wrote no run of its own
    ddp = read_scalars(run_dirs[0])
    (single_dir,) = (runs["single", impl][0] / "runs").glob("*/version_*")
    single = read_scalars(single_dir)
    assert [s for s, _ in ddp["train/mse"]] == list(range(STEPS))  # one value per step, not one per process
    for (_, a), (_, b) in zip(ddp["train/mse"], single["train/mse"]):
        assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL)
    # counters are per process: process 0 ran one forward and one backward per step
    expected = STEPS if impl == "triton" else 0
    assert ddp["calls/forward"][-1] == (STEPS - 1, expected)
    assert ddp["calls/backward"][-1] == (STEPS - 1, expected)
    assert ddp["reload/max_abs_diff"] == [(STEPS, 0.0)]
    assert proc.stdout.count(f"run {impl}_seed0: OK") == 1  # one summary, from process 0


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_ddp_checkpoint_is_written_once_and_reloads_in_one_process(runs, impl):
    d, _ = runs["ddp", impl]
    ckpt_dirs = list((d / "checkpoints").glob("*/version_*"))
    assert len(ckpt_dirs) == 1
    assert sorted(p.name for p in ckpt_dirs[0].iterdir()) == [
        "end.json",  # the record of the run's end
        "final.ckpt",
        "last.ckpt",
        "step00008.ckpt",
        "step00016.ckpt",
    ]
    # one process, where the kernels run: the outputs the DDP run recorded, bit for bit
    now, recorded = rerun_recorded_outputs(final(runs, "ddp", impl))
    assert torch.equal(now, recorded)


def mse_in_one_process(ckpt, split):
    """The exact MSE of a checkpoint's network over every row of a split, computed here in float64."""
    from rmsnorm_kernel.training.network import NETWORK_KEYS, build_network

    net = build_network(**{k: ckpt["hyper_parameters"][k] for k in NETWORK_KEYS})
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()})
    x, y = split.tensors
    with torch.no_grad():
        return float((net.eval()(x).double() - y.double()).pow(2).sum() / y.numel())


# 4 steps of a global batch of 48 rows; evaluation splits that 2 and 3 processes cannot split evenly
EXACT = [
    "norm=reference",
    "trainer.max_steps=4",
    "trainer.val_check_interval=4",
    "checkpoint.every_n_steps=4",
    "data.train_size=480",
    "data.val_size=50",
    "data.test_size=67",
]


@pytest.mark.skipif(GPUS > 0, reason="the 3-process run is on the CPU")
def test_val_and_test_mse_are_exact_with_1_2_and_3_processes(tmp_path):
    from rmsnorm_kernel.ops.tolerances import TOLERANCES
    from rmsnorm_kernel.training.data import make_splits

    tol = TOLERANCES[torch.float32]
    _, val, test = make_splits(64, 16, (480, 50, 67), 0.05, 1234)  # the data config's input, output, noise, seed
    logged = {}
    for n in (1, 2, 3):
        d = tmp_path / f"p{n}"
        d.mkdir()
        batch = [f"data.batch_size={48 // n}"]
        if n == 1:
            assert train(d, *EXACT, *batch).ok
        else:
            proc = train_process(
                d,
                *EXACT,
                *batch,
                "trainer.strategy=ddp",
                f"trainer.devices={n}",
                "trainer.accelerator=cpu",
                "paths.runs=runs",
                "paths.checkpoints=checkpoints",
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
        final_ckpt = read_checkpoint(checkpoint_of(d, "reference"))
        (log_dir,) = (d / "runs").glob("*/version_*")
        s = read_scalars(log_dir)
        # what this run logged is the exact MSE of its own final weights over every row (validation ran at
        # the last step, on the final weights): not that of a padded split
        for tag, split in (("test/mse", test), ("val/mse", val)):
            value = s[tag][-1][1]
            assert math.isclose(value, mse_in_one_process(final_ckpt, split), rel_tol=tol.rtol, abs_tol=tol.atol), (
                n,
                tag,
            )
        logged[n] = s["test/mse"][-1][1]
    assert math.isclose(logged[1], logged[2], rel_tol=tol.rtol, abs_tol=tol.atol)
    assert math.isclose(logged[1], logged[3], rel_tol=tol.rtol, abs_tol=tol.atol)


#: Run first in process 0's interpreter: during step 6 it sends SIGINT to its whole process group, as Ctrl+C
#: in a terminal does, so that both processes receive it (and process 0 forwards one more to process 1).
CTRL_C_AT_STEP_6 = """
import os, signal
from rmsnorm_kernel.training.model import RMSNormRegressor
_training_step = RMSNormRegressor.training_step
def _signalled(self, batch, batch_idx):
    out = _training_step(self, batch, batch_idx)
    if self.global_step == 5:
        os.killpg(0, signal.SIGINT)
    return out
RMSNormRegressor.training_step = _signalled
"""


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_ctrl_c_stops_both_processes_at_one_step_and_the_run_resumes_to_the_same_weights(tmp_path, strategy):
    args = ["norm=triton", *SCHEDULE, f"trainer.strategy={strategy}", *DDP[1:], "data.batch_size=16"]
    code = f"{CTRL_C_AT_STEP_6}\nimport runpy, sys\nsys.argv = {[str(ROOT / 'train.py'), *args, *QUIET]!r}\n"
    code += "runpy.run_path(sys.argv[0], run_name='__main__')"
    (tmp_path / "stopped").mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "stopped",
        capture_output=True,
        text=True,
        timeout=600,  # a hang (the processes waiting for each other) fails here
        start_new_session=True,  # its own process group: the signal reaches no one else
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "train.py: stopped by SIGINT at step 6;" in proc.stderr
    stopped = read_checkpoint(checkpoint_of(tmp_path / "stopped", "triton", "last.ckpt"))
    assert stopped["global_step"] == 6
    resumed = train_process(tmp_path / "stopped", *args, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (tmp_path / "straight").mkdir()
    straight = train_process(tmp_path / "straight", *args)
    assert straight.returncode == 0, straight.stderr[-3000:]
    a = read_checkpoint(checkpoint_of(tmp_path / "stopped", "triton"))["state_dict"]
    b = read_checkpoint(checkpoint_of(tmp_path / "straight", "triton"))["state_dict"]
    assert all(a[k].equal(v) for k, v in b.items())
