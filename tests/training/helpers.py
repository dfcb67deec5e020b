"""What the training tests share: tiny in-process runs, reading their files back, comparing checkpoints.

A tiny run trains 4 steps on 128 examples and validates and tests on 32, with validation, the parity
check and the step timer's window every 2 steps, so that a run of the Triton path through Triton's
interpreter takes about a second. Its files go under the folder it is given.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.testing import forward_block_mean
from rmsnorm_kernel.training import cli
from rmsnorm_kernel.training.checkpoints import read_checkpoint
from rmsnorm_kernel.training.events import read_scalars
from rmsnorm_kernel.training.model import RMSNormRegressor
from rmsnorm_kernel.training.network import NETWORK_KEYS, build_network
from rmsnorm_kernel.training.run import RunResult, run
from tests.helpers import DEVICE, QUIET, compose_cfg

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
#: Data parallelism on 2 processes of one kind of device: 2 GPUs, or the CPU where there is no CUDA at all.
DDP = ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=gpu" if GPUS else "trainer.accelerator=cpu"]
#: FSDP2 (Lightning's ModelParallelStrategy and fully_shard) on the same 2 processes.
FSDP2 = ["trainer.strategy=fsdp2", *DDP[1:]]
needs_two_processes = pytest.mark.skipif(
    GPUS == 1, reason="DDP needs 2 processes on one kind of device: 2 GPUs here, or the CPU (no CUDA at all)"
)

SCHEDULE = [
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "parity.every_n_steps=2",
    "trainer.log_every_n_steps=2",
    "checkpoint.every_n_steps=2",
    "data.train_size=128",
    "data.val_size=32",
    "data.test_size=32",
]
TINY = [*SCHEDULE, *QUIET]  # train_process adds QUIET itself: give it SCHEDULE


def tiny_cfg(root, *overrides):
    """The configuration ``train.py`` would compose, on the tiny schedule, writing under ``root``."""
    return compose_cfg([*TINY, f"paths.runs={root}/runs", f"paths.checkpoints={root}/checkpoints", *overrides])


@contextlib.contextmanager
def torch_flags_kept():
    # Lightning's deterministic=True switches torch's deterministic algorithms on for the whole process;
    # the other tests of this process must not inherit that.
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def train(root, *overrides) -> RunResult:
    """``run()`` in this process on the tiny schedule (``overrides`` come last and win)."""
    with torch_flags_kept():
        return run(tiny_cfg(root, *overrides))


def main(root, *overrides) -> RunResult:
    """``train.py``'s body in this process on the tiny schedule; failures raise ``SystemExit``."""
    with torch_flags_kept():
        return cli.main(tiny_cfg(root, *overrides))


_SHARED: dict[tuple[str, ...], tuple] = {}


def shared_run(tmp_path_factory, *overrides):
    """A tiny run made once per test session and shared by the tests that only read it: (root, result)."""
    if overrides not in _SHARED:
        root = tmp_path_factory.mktemp("shared_run")
        _SHARED[overrides] = (root, train(root, *overrides))
    return _SHARED[overrides]


def run_dirs(root) -> dict[str, object]:
    """The TensorBoard folder of each norm path under ``root/runs``."""
    return {p.parent.name.split("_")[0]: p for p in sorted((root / "runs").glob("*_seed*/version_*"))}


def scalars_of(root, impl):
    (log_dir,) = (root / "runs").glob(f"{impl}_seed*/version_*")
    return read_scalars(log_dir)


def checkpoint_of(root, impl, name="final.ckpt"):
    (path,) = (root / "checkpoints").glob(f"{impl}_seed*/version_*/{name}")
    return path


def final_state(root, impl):
    return read_checkpoint(checkpoint_of(root, impl))


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


def files_under(root) -> dict:
    """Every file under ``root`` with its bytes: a test compares this before and after a refused command."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def block_mean_forward(x, gamma, eps, *_, activation=None, **__):
    """A stand-in for ``ops.launchers.rmsnorm_forward`` with the divide-by-BLOCK defect (wrong at N = 257);
    it ignores the call counter and any further launch arguments."""
    return forward_block_mean(x, gamma, eps, activation)


def rerun_recorded_outputs(ckpt) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's network rebuilt in this process where the kernels run, on the test inputs the
    checkpoint recorded: (its outputs now, on the CPU; the outputs recorded when the file was written)."""
    net = build_network(**{k: ckpt["hyper_parameters"][k] for k in NETWORK_KEYS}).to(DEVICE)
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()})
    probe = ckpt["rmsnorm_kernel"]
    with torch.no_grad():
        out = net.eval()(probe["test_inputs"].to(DEVICE))
    return out.float().cpu(), probe["test_outputs"]


def full_disk_after(monkeypatch, module, name, writes):
    """``module``'s ``open`` refuses, with ENOSPC, the ``writes``-th write of a temporary of ``name``."""
    real_open, seen = open, []

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(bytes(data)[:100])  # part of it, as a disk that fills up mid-write
            raise OSError(errno.ENOSPC, "No space left on device")

    def refusing_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if Path(file).name.startswith(f".{name}.") and "w" in mode:
            seen.append(file)
            if len(seen) == writes:
                return Full(f)
        return f

    monkeypatch.setattr(module, "open", refusing_open, raising=False)


def signal_after_step(monkeypatch, step, signum):
    """The process sends itself ``signum`` during training step ``step`` (as a scheduler would), which the
    run then ends with."""
    training_step = RMSNormRegressor.training_step

    def signalled(self, batch, batch_idx):
        out = training_step(self, batch, batch_idx)
        if self.global_step == step - 1:  # the step's own count, before its optimizer step
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(RMSNormRegressor, "training_step", signalled)
