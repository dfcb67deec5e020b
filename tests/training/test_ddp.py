"""Data parallelism through Lightning's DDP (2 processes: CPU with gloo, or 2 GPUs): same training as one process."""

import math

import pytest
import torch

from rmsnorm_kernel.checkpoints import read_checkpoint
from rmsnorm_kernel.model import build_network
from rmsnorm_kernel.tolerances import TRAINING_CURVE_RTOL, compare
from rmsnorm_kernel.events import read_scalars

from .test_training import train

STEPS = 40
SCHEDULE = [f"trainer.max_steps={STEPS}", "trainer.val_check_interval=20", "checkpoint.every_n_steps=20"]
# Two processes on the CPU where the kernels run through the interpreter; where they run on CUDA, two
# GPUs (the Triton path accepts no CPU tensors there).
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
DDP_DEVICE = ["trainer.accelerator=gpu"] if GPUS else ["trainer.accelerator=cpu"]
pytestmark = pytest.mark.skipif(
    GPUS == 1, reason="DDP needs 2 processes on one kind of device: 2 GPUs here, or the CPU (no CUDA at all)"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both paths, once on 2 processes x 16 examples and once on 1 process x 32: the same global batch."""
    out = {}
    for layout, args in {
        "ddp": ["trainer.strategy=ddp", "trainer.devices=2", *DDP_DEVICE, "data.batch_size=16"],
        "single": ["data.batch_size=32"],
    }.items():
        for impl in ("reference", "triton"):
            d = tmp_path_factory.mktemp(f"{layout}_{impl}")
            proc = train(d, f"norm={impl}", *SCHEDULE, *args)
            assert proc.returncode == 0, proc.stderr[-3000:]
            out[layout, impl] = (d, proc)
    return out


def final(d, impl):
    (path,) = (d / "checkpoints" / f"{impl}_seed0").glob("version_*/final.ckpt")
    return path, read_checkpoint(path)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_ddp_final_weights_match_the_single_process_run_at_the_same_global_batch(runs, impl):
    _, ddp = final(runs["ddp", impl][0], impl)
    _, single = final(runs["single", impl][0], impl)
    assert ddp["global_step"] == single["global_step"] == STEPS
    for key, tensor in single["state_dict"].items():
        c = compare(ddp["state_dict"][key], tensor)
        assert c.ok, f"{key}: max abs {c.max_abs:.3g}"


def test_ddp_paths_agree_with_each_other(runs):
    _, ref = final(runs["ddp", "reference"][0], "reference")
    _, tri = final(runs["ddp", "triton"][0], "triton")
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
    assert sorted(p.name for p in ckpt_dirs[0].iterdir()) == ["final.ckpt", "last.ckpt", "step00020.ckpt", "step00040.ckpt"]
    _, ckpt = final(d, impl)
    hp = ckpt["hyper_parameters"]
    net = build_network(**{k: hp[k] for k in ("input_dim", "hidden_dim", "output_dim", "norm_impl", "eps")})
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()})
    probe = ckpt["rmsnorm_kernel"]
    with torch.no_grad():
        out = net(probe["test_inputs"])
    assert torch.equal(out, probe["test_outputs"])  # the outputs recorded by the DDP run, bit for bit
