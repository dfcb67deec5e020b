"""Every verdict a run reports survives a resume, and every summary number is that of the global batch.

The faults are built here: a Triton forward 1% off (its initial parity check fails), a run stopped by
SIGTERM at step 3 of 4 and resumed with ``ckpt_path=last``, a checkpoint without the verdicts a run
carries, and a strategy whose mean over processes is not this process's value. The DDP test (slow) runs
two real processes."""

import math
import re
import signal

import pytest

from rmsnorm_kernel.ops import launchers
from rmsnorm_kernel.training.checkpoints import atomic_torch_save, read_checkpoint
from rmsnorm_kernel.training.on_signal import Interrupted
from rmsnorm_kernel.training.summary import format_summary

from .helpers import DDP, checkpoint_of, main, needs_two_processes, scalars_of, shared_run, signal_after_step, train

STOP_STEP = 3  # of the tiny schedule's 4, between its checkpoints at steps 2 and 4


def one_percent_off(monkeypatch):
    """The Triton forward, every output 1% too large (its calls still counted)."""
    real = launchers.rmsnorm_forward
    monkeypatch.setattr(launchers, "rmsnorm_forward", lambda *args, **kwargs: real(*args, **kwargs) * 1.01)


def exit_of(root, capsys, *overrides):
    """``train.py`` in this process, which must fail: (exit code, last line of stderr, summary lines)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(root, *overrides)
    out, err = capsys.readouterr()
    return exit_.value.code, err.strip().splitlines()[-1], out.splitlines()


def line_of(lines, start):
    (line,) = [s for s in lines if s.startswith(start)]
    return line


def test_a_failed_initial_parity_stays_failed_after_a_sigterm_and_a_resume(tmp_path, monkeypatch, capsys):
    """docs/resume-and-faults.md, "Verdicts across a resume": the same exit 1 and the same one line."""
    one_percent_off(monkeypatch)
    common = ["norm=triton", "parity.every_n_steps=0"]  # the initial check alone: the run trains to its end
    code, straight, lines = exit_of(tmp_path / "straight", capsys, *common)
    assert code == 1 and straight.startswith(
        "train.py: check failed: initial parity: triton outputs differ from the reference by "
    )
    initial = line_of(lines, "  initial parity (step 0), triton")
    assert initial.endswith("FAILED (beyond the tolerance)")
    with monkeypatch.context() as m:
        signal_after_step(m, STOP_STEP, signal.SIGTERM)
        code, _, _ = exit_of(tmp_path / "stopped", capsys, *common)
    assert code == 143
    saved = read_checkpoint(checkpoint_of(tmp_path / "stopped", "triton", "last.ckpt"))
    assert saved["global_step"] == STOP_STEP
    assert saved["callbacks"]["Parity"]["ok"] is False and saved["callbacks"]["Parity"]["checked_steps"] == [0]
    code, resumed, lines = exit_of(tmp_path / "stopped", capsys, *common, "ckpt_path=last")
    assert (code, resumed) == (1, straight)
    assert line_of(lines, "  initial parity (step 0), triton") == initial


def test_counts_and_parity_checks_of_a_resumed_run_cover_the_whole_history(tmp_path, tmp_path_factory, monkeypatch):
    """docs/resume-and-faults.md, "Verdicts across a resume": counts summed, every check reported."""
    _, straight = shared_run(tmp_path_factory, "norm=triton")
    with monkeypatch.context() as m:
        signal_after_step(m, STOP_STEP, signal.SIGTERM)
        with pytest.raises(Interrupted):
            train(tmp_path, "norm=triton")

    def checked(name):
        return read_checkpoint(checkpoint_of(tmp_path, "triton", name))["callbacks"]["Parity"]["checked_steps"]

    assert checked("step00002.ckpt") == [0]  # written as step 1 ended, before step 2's check
    assert checked("last.ckpt") == [0, 2]  # the signal's, at step 3
    resumed = train(tmp_path, "norm=triton", "ckpt_path=last")  # trains step 3 alone
    assert resumed.ok, resumed.failures
    # integration over the history: one forward and one backward per step trained, 3 of them before the stop
    assert resumed.calls["train/forward"] == resumed.calls["train/backward"] == resumed.steps == 4
    assert resumed.calls == straight.calls  # validation, test and the parity check's own calls too
    for key in ("parity/initial_output_err", "parity/initial_grad_err", "parity/checks", "parity/worst_over_tol"):
        assert resumed.metrics[key] == straight.metrics[key], key
    assert resumed.metrics["parity/checks"] == 2  # steps 0 and 2, both before the stop: from the checkpoint
    assert checked("step00004.ckpt") == checked("last.ckpt") == checked("final.ckpt") == [0, 2]


def test_a_resume_from_a_checkpoint_without_verdicts_fails_saying_they_are_unknown(tmp_path):
    """docs/resume-and-faults.md, "Verdicts across a resume": unknown is never reported as passed."""
    assert train(tmp_path, "norm=triton", "trainer.max_steps=2").ok
    last = checkpoint_of(tmp_path, "triton", "last.ckpt")
    old = read_checkpoint(last)
    del old["callbacks"]["Parity"], old["calls"]  # as a checkpoint written before they were carried
    atomic_torch_save(old, last)
    resumed = train(tmp_path, "norm=triton", "trainer.max_steps=4", "ckpt_path=last")
    assert not resumed.ok
    assert resumed.failures[0] == (
        "initial parity: unknown: this run resumed at step 2 from a checkpoint that carries no parity verdicts of "
        "triton and native, so the checks of the steps before it were not seen"
    )
    assert resumed.failures[1:] == [
        "integration: unknown: this run resumed at step 2 from a checkpoint that carries no Triton call counts, "
        "so the calls of the steps before it were not counted"
    ]
    summary = format_summary(resumed)
    assert "  initial parity: unknown: the checkpoint this run resumed from carries no parity verdicts" in summary
    assert "initial parity (step 0)" not in summary
    # what was not seen stays unknown in the checkpoints this run wrote, through any later resume
    again = train(tmp_path, "norm=triton", "trainer.max_steps=5", "ckpt_path=last")
    assert [f.split(":")[0:2] for f in again.failures] == [["initial parity", " unknown"], ["integration", " unknown"]]
    assert "at step 2 " in again.failures[0] and "at step 2 " in again.failures[1]


def test_a_resume_from_a_checkpoint_without_native_verdicts_keeps_the_kernels_and_fails_native_as_unknown(tmp_path):
    """docs/resume-and-faults.md, "Verdicts across a resume": a checkpoint written before the native path
    was compared loads; the kernel's verdicts come back whole, native's before the resume are unknown."""
    assert train(tmp_path, "norm=native", "trainer.max_steps=2").ok
    last = checkpoint_of(tmp_path, "native", "last.ckpt")
    old = read_checkpoint(last)
    kernel = dict(old["callbacks"]["Parity"])
    old["callbacks"]["Parity"] = {k: v for k, v in kernel.items() if not k.startswith("native_")}
    assert len(old["callbacks"]["Parity"]) < len(kernel)  # the native keys were there: now they are not
    atomic_torch_save(old, last)
    resumed = train(tmp_path, "norm=native", "trainer.max_steps=4", "ckpt_path=last")
    assert resumed.failures == [
        "initial parity: unknown: this run resumed at step 2 from a checkpoint that carries no parity verdicts of "
        "native, so the checks of the steps before it were not seen"
    ]
    assert resumed.metrics["parity/initial_output_err"] == kernel["output_err"]  # from the checkpoint
    assert resumed.metrics["parity/native_initial_output_err"] is None  # never seen
    assert resumed.metrics["parity/checks"] == 2  # step 0 (from the checkpoint) and step 2
    summary = format_summary(resumed)
    assert "  initial parity (step 0), triton against the reference: output " in summary
    assert "native against the reference: unknown: the checkpoint this run resumed from carries no verdicts" in summary
    saved = read_checkpoint(resumed.checkpoint)["callbacks"]["Parity"]
    assert saved["native_unknown_before"] == 2 and saved["native_failed_steps"] == []  # step 2's check passed


def test_the_summarys_train_mse_is_the_global_batch_value_tensorboard_logs(tmp_path, monkeypatch):
    """docs/resume-and-faults.md, "Numbers under data parallelism": with another process's rows (a mean
    over processes 1 larger than this process's MSE), the summary and TensorBoard give the global value."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    reduce = SingleDeviceStrategy.reduce

    def with_another_process(self, tensor, *args, reduce_op="mean", **kwargs):
        out = reduce(self, tensor, *args, reduce_op=reduce_op, **kwargs)
        return out + 1.0 if reduce_op == "mean" else out

    monkeypatch.setattr(SingleDeviceStrategy, "reduce", with_another_process)
    result = train(tmp_path, "norm=reference")
    logged = scalars_of(tmp_path, "reference")["train/mse"]
    assert logged[-1][1] > 1.0  # the global value
    assert result.metrics["train/mse"] == logged[-1][1]
    assert f"mse: train {logged[-1][1]:.6f}," in format_summary(result)


@pytest.mark.slow
@needs_two_processes
def test_under_ddp_the_summary_prints_the_global_numbers_tensorboard_has(tmp_path):
    """docs/resume-and-faults.md, "Numbers under data parallelism": 2 processes on the CPU."""
    from rmsnorm_kernel.training.events import read_scalars
    from tests.helpers import train_process

    from .helpers import SCHEDULE

    ddp = [*DDP, "data.batch_size=16"]
    proc = train_process(tmp_path, *SCHEDULE, "norm=triton", *ddp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log_dir,) = (tmp_path / "runs").glob("*/version_*")
    s = read_scalars(log_dir)
    out = proc.stdout
    train_mse = float(re.search(r"mse: train ([0-9.]+),", out).group(1))
    assert math.isclose(train_mse, s["train/mse"][-1][1], abs_tol=5e-7)  # printed to 6 decimals
    initial = re.search(r"initial parity \(step 0\), triton against the reference: output ([^,]+), grad ([^:]+):", out)
    assert float(initial.group(1)) == float(f"{s['parity/initial_output_err'][-1][1]:.3g}")
    assert float(initial.group(2)) == float(f"{s['parity/initial_grad_err'][-1][1]:.3g}")
    # the counts are per process, labelled so, and the same as TensorBoard's calls/*
    calls = re.search(
        r"Triton calls per process \(process 0's, as TensorBoard's calls/\*\): train forward (\d+), ", out
    )
    assert int(calls.group(1)) == s["calls/forward"][-1][1] == 4
