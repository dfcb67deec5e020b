"""Resuming: exact continuation after a crash, the checkpoint ``ckpt_path`` names checked before any
work, and reproducible runs. The slow tests kill real ``train.py`` processes."""

import argparse
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.training.checkpoints import AtomicCheckpointIO, read_checkpoint
from rmsnorm_kernel.training.events import read_scalars
from rmsnorm_kernel.training.model import RMSNormRegressor
from tests.helpers import ROOT, train_process

from .helpers import (
    SCHEDULE,
    assert_same_tree,
    checkpoint_of,
    files_under,
    final_state,
    main,
    scalars_of,
    shared_run,
    signal_after_step,
    train,
)

# 10 steps of 4 batches an epoch, checkpoints every 3: a crash right after step 6 is mid-epoch, between
# two validations (at steps 4 and 8).
RESUMABLE = ["trainer.max_steps=10", "checkpoint.every_n_steps=3", "trainer.val_check_interval=4"]
CRASH_STEP = 6


class Crash(Exception):
    pass


def crash_after_checkpoint_of_step(monkeypatch, step):
    # The module's hook runs after the callbacks', so the step's checkpoint is on disk when it raises.
    end = RMSNormRegressor.on_train_batch_end

    def on_train_batch_end(self, *args):
        end(self, *args)
        if self.global_step == step:
            raise Crash(f"step {step}")

    monkeypatch.setattr(RMSNormRegressor, "on_train_batch_end", on_train_batch_end)


def crash_after_checkpoint_written(monkeypatch, step):
    """Raises ``Crash`` the moment step ``step``'s checkpoint is complete on disk: right after its
    ``last.ckpt``, written after the step's own file."""
    save = AtomicCheckpointIO.save_checkpoint

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if Path(path).name == "last.ckpt" and checkpoint["global_step"] == step:
            raise Crash(f"step {step}")

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_checkpoint)


def count_validations(monkeypatch, seen):
    """Appends to ``seen`` the step of every validation pass (not the sanity check) the runs make."""
    end = RMSNormRegressor.on_validation_epoch_end

    def on_validation_epoch_end(self):
        end(self)
        if not self.trainer.sanity_checking:
            seen.append(self.global_step)

    monkeypatch.setattr(RMSNormRegressor, "on_validation_epoch_end", on_validation_epoch_end)


def assert_same_training(whole, resumed, impl, steps):
    a, b = final_state(whole, impl), final_state(resumed, impl)
    assert a["global_step"] == b["global_step"] == steps
    assert_same_tree(a["state_dict"], b["state_dict"], "state_dict")
    assert_same_tree(a["optimizer_states"], b["optimizer_states"], "optimizer_states")  # Adam's moments and steps
    sa, sb = scalars_of(whole, impl), scalars_of(resumed, impl)
    assert [s for s, _ in sb["train/mse"]] == list(range(steps))  # one value per step, none lost or doubled
    assert sa["train/mse"] == sb["train/mse"]
    # calls are logged where they are read (log interval, checkpoints, signals): the same count at each step both logged
    a_calls, b_calls = dict(sa["calls/forward"]), dict(sb["calls/forward"])
    assert a_calls[steps - 1] == b_calls[steps - 1]
    assert all(a_calls[step] == b_calls[step] for step in a_calls.keys() & b_calls.keys())
    assert sa["val/mse"] == sb["val/mse"] and sa["test/mse"] == sb["test/mse"]


# The Triton path's in-process case runs with -m slow: its resumes are tested by default below (a crash
# after a validation step, after the last step, a signal before a validation pass).
@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=pytest.mark.slow)])
def test_run_crashed_mid_epoch_and_resumed_ends_bit_identical(tmp_path, monkeypatch, impl):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    straight = train(whole, f"norm={impl}", *RESUMABLE)
    assert straight.ok
    with monkeypatch.context() as m:
        crash_after_checkpoint_of_step(m, CRASH_STEP)
        with pytest.raises(Crash):
            train(broken, f"norm={impl}", *RESUMABLE)
    assert read_checkpoint(checkpoint_of(broken, impl, "last.ckpt"))["global_step"] == CRASH_STEP
    stale = checkpoint_of(broken, impl, "last.ckpt").with_name(".last.ckpt.4242.tmp")
    stale.write_bytes(b"half a checkpoint")  # what a writer killed mid-write leaves
    resumed = train(broken, f"norm={impl}", *RESUMABLE, "ckpt_path=last")
    assert resumed.ok, resumed.failures
    # step 0's, carried by the checkpoint
    assert resumed.metrics["parity/initial_output_err"] == straight.metrics["parity/initial_output_err"]
    assert not stale.exists()
    assert_same_training(whole, broken, impl, steps=10)


def test_a_run_that_crashed_after_its_last_step_completes_on_resume(tmp_path, tmp_path_factory, monkeypatch):
    # its last checkpoint is at max_steps: the resumed run has no step left to train, only the end to do
    with monkeypatch.context() as m:
        crash_after_checkpoint_written(m, 4)
        with pytest.raises(Crash):
            train(tmp_path, "norm=triton")
    assert not checkpoint_of(tmp_path, "triton", "last.ckpt").with_name("final.ckpt").exists()
    resumed = train(tmp_path, "norm=triton", "ckpt_path=last")
    assert resumed.ok, resumed.failures
    assert resumed.steps == 4 and resumed.calls["train/forward"] == 4
    whole, _ = shared_run(tmp_path_factory, "norm=triton")
    a, b = final_state(whole, "triton"), final_state(tmp_path, "triton")
    assert_same_tree(a["state_dict"], b["state_dict"])
    assert_same_tree(a["optimizer_states"], b["optimizer_states"])
    sa, sb = scalars_of(whole, "triton"), scalars_of(tmp_path, "triton")
    assert sa["train/mse"] == sb["train/mse"] and sa["val/mse"] == sb["val/mse"]  # the last step's included


@pytest.mark.parametrize(
    "impl,step,schedule",
    [
        ("triton", 2, []),  # the tiny schedule: 4 batches an epoch, validation and checkpoints every 2 steps
        ("reference", 4, ["trainer.max_steps=6", "trainer.val_check_interval=4", "checkpoint.every_n_steps=4"]),
    ],
    ids=["mid-epoch", "last-batch-of-an-epoch"],
)
def test_a_crash_right_after_the_checkpoint_of_a_validation_step_resumes_with_the_straight_runs_history(
    tmp_path, tmp_path_factory, monkeypatch, impl, step, schedule
):
    """docs/resume-and-faults.md, "Resuming": the checkpoint of a validation step is written after that
    validation, so a crash right after it loses no ``val/mse`` and repeats none, nor any other per-step work."""
    common = [f"norm={impl}", *schedule]
    if schedule:
        whole = tmp_path / "whole"
        assert train(whole, *common).ok
    else:
        whole, _ = shared_run(tmp_path_factory, *common)
    broken, seen = tmp_path / "broken", []
    with monkeypatch.context() as m:
        count_validations(m, seen)
        crash_after_checkpoint_written(m, step)
        with pytest.raises(Crash):
            train(broken, *common)
        assert seen[-1] == step  # the crash came after that step's validation ...
        assert read_checkpoint(checkpoint_of(broken, impl, f"step{step:05d}.ckpt"))["global_step"] == step
        assert [s for s, _ in scalars_of(broken, impl)["val/mse"]][-1] == step - 1  # ... whose val/mse is on disk
        resumed = train(broken, *common, "ckpt_path=last")
    assert resumed.ok, resumed.failures
    assert not resumed.branched_from
    sa, sb = scalars_of(whole, impl), scalars_of(broken, impl)
    steps = resumed.steps
    # every validation once over the two processes, at the straight run's validation steps
    assert seen == [s + 1 for s, _ in sa["val/mse"]] == [s + 1 for s, _ in sb["val/mse"]]
    assert_same_training(whole, broken, impl, steps=steps)
    # the other per-step work: parity checks, call counts, every scalar but the times at the same steps with
    # the same values; the step timer's windows logged at the same steps
    assert {k: v for k, v in sa.items() if not k.startswith("time/")} == {
        k: v for k, v in sb.items() if not k.startswith("time/")
    }
    assert [s for s, _ in sa["time/step_ms"]] == [s for s, _ in sb["time/step_ms"]]
    a, b = final_state(whole, impl), final_state(broken, impl)
    assert a["calls"] == b["calls"]  # val/forward: each validation batch once (on the triton path)
    assert a["callbacks"]["Parity"] == b["callbacks"]["Parity"]
    assert b["callbacks"]["Parity"]["checked_steps"] == list(range(0, steps, 2))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_two_runs_with_the_same_configuration_are_bit_identical(tmp_path, tmp_path_factory, impl):
    first, _ = shared_run(tmp_path_factory, f"norm={impl}")
    assert train(tmp_path, f"norm={impl}").ok
    a, b = final_state(first, impl), final_state(tmp_path, impl)
    assert_same_tree(a["state_dict"], b["state_dict"])
    assert_same_tree(a["optimizer_states"], b["optimizer_states"])
    # every scalar but the times, which measure the machine
    untimed = [
        {k: v for k, v in scalars_of(root, impl).items() if not k.startswith("time/")} for root in (first, tmp_path)
    ]
    assert untimed[0] == untimed[1]


def test_ckpt_path_last_without_a_previous_run_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, "ckpt_path=last")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train.py: checkpoint error: ckpt_path=last: {tmp_path}/checkpoints/triton_seed0 "
        "holds no checkpoint to resume from"
    )
    assert list(tmp_path.iterdir()) == []


def make_bad(kind, folder, good):
    bad = folder / f"{kind}.ckpt"
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
def test_bad_checkpoint_file_gives_one_line_and_changes_nothing(
    tmp_path, tmp_path_factory, monkeypatch, capsys, kind, message
):
    monkeypatch.chdir(tmp_path)  # where the "code" pickle would create its file
    good = checkpoint_of(shared_run(tmp_path_factory, "norm=triton")[0], "triton", "last.ckpt")
    bad = tmp_path / "missing.ckpt" if kind == "missing" else make_bad(kind, tmp_path, good)
    before = files_under(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, f"ckpt_path={bad}")
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"train.py: checkpoint error: checkpoint {bad} {message}")
    )
    assert files_under(tmp_path) == before
    assert not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["norm=triton"], "was trained with norm path = 'reference'; the configuration asks for 'triton'"),
        (
            ["norm=reference", "model.hidden_dim=128"],
            "was trained with hidden_dim = 257; the configuration asks for 128",
        ),
        (["norm=reference", "data.batch_size=16"], "was trained with batch_size = 32; the configuration asks for 16"),
    ],
)
def test_checkpoint_of_another_configuration_is_refused(tmp_path, tmp_path_factory, capsys, overrides, message):
    ref = checkpoint_of(shared_run(tmp_path_factory, "norm=reference")[0], "reference", "last.ckpt")
    before = ref.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, f"ckpt_path={ref}", *overrides)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"train.py: checkpoint error: checkpoint {ref} {message}"
    assert ref.read_bytes() == before
    assert list(tmp_path.iterdir()) == []


KILL_AT_STEP = (
    "import os\n"
    "from rmsnorm_kernel.training.model import RMSNormRegressor\n"
    "_end = RMSNormRegressor.on_train_batch_end\n"
    "def on_train_batch_end(self, *a):\n"
    "    _end(self, *a)\n"
    "    if self.global_step == {step}:\n"
    "        os._exit(9)  # a crash right after the step's checkpoint: no cleanup of any kind\n"
    "RMSNormRegressor.on_train_batch_end = on_train_batch_end\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_process_killed_mid_epoch_and_resumed_ends_bit_identical(tmp_path, impl):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    broken.mkdir()
    common = [f"norm={impl}", *RESUMABLE]
    assert train(whole, *common).ok  # uninterrupted, in this process: the same bits as in another
    common = [*SCHEDULE, *common]
    crashed = train_process(broken, *common, prelude=KILL_AT_STEP.format(step=CRASH_STEP))
    assert crashed.returncode == 9  # stopped at step 6 of 10, in the second epoch of 4 batches
    resumed = train_process(broken, *common, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(whole, broken, impl, steps=10)


def newest_write(folder) -> float:
    # last.ckpt is rewritten at every checkpoint, after the step's own file
    return max((p.stat().st_mtime for p in folder.glob("checkpoints/*/*/last.ckpt")), default=0.0)


def next_write(proc, folder, after: float) -> float | None:
    """When the running process next completes a checkpoint after ``after``; None if it ends first."""
    while proc.poll() is None:
        t = newest_write(folder)
        if t > after:
            return t
        time.sleep(0.005)
    return None


@pytest.mark.slow
def test_sigkill_at_random_moments_never_leaves_a_bad_checkpoint(tmp_path):
    """Kill a real training process three times (checkpoints every 2 steps), resuming from last each time."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    killed.mkdir()
    schedule = ["trainer.max_steps=60", "checkpoint.every_n_steps=2", "trainer.val_check_interval=10"]
    assert train(whole, *schedule).ok
    args = [*SCHEDULE, *schedule, "trainer.enable_progress_bar=false"]
    rng = random.Random(2026)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for kill in range(4):
        resume = ["ckpt_path=last"] if list(killed.glob("checkpoints/*/*/last.ckpt")) else []
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args, *resume],
            cwd=killed,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if kill == 3:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            break
        # Two checkpoints of this process give the time of 2 steps on this machine (the GPU's or the
        # interpreter's); the kill comes within 3 such intervals, at any moment of a step or a write,
        # so each process gets about 10 of the 60 steps done.
        first = next_write(proc, killed, started)
        second = next_write(proc, killed, first) if first else None
        assert second, f"the run ended before kill {kill + 1}: {proc.stderr.read()[-3000:]}"
        time.sleep(rng.uniform(0.0, 3 * (second - first)))
        assert proc.poll() is None, f"the run ended before kill {kill + 1}: {proc.stderr.read()[-3000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        for ckpt in killed.glob("checkpoints/*/*/*.ckpt"):
            read_checkpoint(ckpt)  # every file in place is complete, at every kill
    for ckpt in killed.glob("checkpoints/*/*/*.ckpt"):
        read_checkpoint(ckpt)
    a, b = final_state(whole, "triton"), final_state(killed, "triton")
    assert_same_tree(a["state_dict"], b["state_dict"])
    assert_same_tree(a["optimizer_states"], b["optimizer_states"])


@pytest.mark.parametrize("max_steps", [4, 3])
def test_resuming_a_run_at_or_past_max_steps_says_so_and_writes_nothing(tmp_path, capsys, max_steps):
    assert train(tmp_path, "norm=reference").ok  # 4 steps, ended: final.ckpt beside last.ckpt
    before = files_under(tmp_path)
    capsys.readouterr()
    result = main(tmp_path, "norm=reference", f"trainer.max_steps={max_steps}", "ckpt_path=last")  # no SystemExit: 0
    last = tmp_path / "checkpoints/reference_seed0/version_0/last.ckpt"
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"train.py: nothing to do: checkpoint {last} is at step 4 and trainer.max_steps is {max_steps}: "
        "nothing to train, nothing written (a larger trainer.max_steps continues it)"
    )
    assert result.steps == 4 and result.calls == {}
    assert files_under(tmp_path) == before  # same files, same bytes


def test_resuming_an_earlier_checkpoint_of_a_run_that_went_further_starts_a_branch(tmp_path):
    run, straight = tmp_path / "run", tmp_path / "straight"
    assert train(run, "norm=reference").ok  # 4 steps, checkpoints at 2 and 4
    assert train(straight, "norm=reference", "trainer.max_steps=3").ok
    before = files_under(run)
    early = run / "checkpoints/reference_seed0/version_0/step00002.ckpt"
    branch = train(run, "norm=reference", "trainer.max_steps=3", f"ckpt_path={early}")
    assert branch.ok, branch.failures
    assert {p: b for p, b in files_under(run).items() if p in before} == before  # the 4-step run as it was
    assert branch.checkpoint == str(run / "checkpoints/reference_seed0/version_1/final.ckpt")
    assert branch.log_dir == str(run / "runs/reference_seed0/version_1")
    assert branch.branched_from == f"{early} at step 2"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(branch.log_dir)
    acc.Reload()
    (event,) = acc.Tensors("resume/branched_from/text_summary")  # the text plugin's tag
    assert event.step == 2 and event.tensor_proto.string_val == [f"{early} at step 2".encode()]
    # the branch trained steps 2..3 exactly as a 3-step run does
    a, b = read_checkpoint(branch.checkpoint), final_state(straight, "reference")
    assert a["global_step"] == b["global_step"] == 3
    assert_same_tree(a["state_dict"], b["state_dict"])
    assert_same_tree(a["optimizer_states"], b["optimizer_states"])


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_writes_last_at_the_step_reached_exits_non_zero_and_resumes_bit_identical(
    tmp_path, monkeypatch, capsys, signum, code
):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job
    assert train(whole, "norm=reference", *RESUMABLE).ok
    step = CRASH_STEP + 1  # between two periodic checkpoints (every 3 steps)
    with monkeypatch.context() as m:
        signal_after_step(m, step, signum)
        with pytest.raises(SystemExit) as exit_:
            main(stopped, "norm=reference", *RESUMABLE)
    assert exit_.value.code == code
    last = stopped / "checkpoints/reference_seed0/version_0/last.ckpt"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train.py: stopped by {signal.Signals(signum).name} at step {step}; {last} holds that step; "
        f"resume with: {shlex.quote(sys.executable)} train.py <the same overrides> ckpt_path={last}"
    )
    assert signal.getsignal(signal.SIGINT) is before  # handlers given back
    assert read_checkpoint(last)["global_step"] == step
    assert not list(last.parent.glob(".*.tmp")) and not last.with_name("final.ckpt").exists()
    assert main(stopped, "norm=reference", *RESUMABLE, f"ckpt_path={last}").ok
    assert_same_training(whole, stopped, "reference", steps=10)


@pytest.mark.slow
def test_sigterm_from_outside_exits_143_and_the_printed_command_resumes_bit_identical(tmp_path):
    import shlex

    whole, stopped = tmp_path / "whole", tmp_path / "stopped dir"  # a space: the command must quote it
    stopped.mkdir()
    assert train(whole, "norm=triton", *RESUMABLE).ok
    args = [
        *SCHEDULE,
        *RESUMABLE,
        "trainer.enable_progress_bar=false",
        "norm=triton",
        f'paths.runs="{stopped}/runs"',
        f'paths.checkpoints="{stopped}/checkpoints"',
    ]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=stopped,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    first = stopped / "checkpoints/triton_seed0/version_0/step00003.ckpt"
    while not first.exists() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    last = stopped / "checkpoints/triton_seed0/version_0/last.ckpt"
    line = err.strip().splitlines()[-1]
    step = read_checkpoint(last)["global_step"]
    assert 3 <= step < 10
    assert line.startswith(f"train.py: stopped by SIGTERM at step {step}; {last} holds that step; resume with: ")
    command = shlex.split(line.split("resume with: ")[1])  # run as printed: the interpreter that ran first
    assert command[0] == sys.executable and command[1] == str(ROOT / "train.py")
    assert command[-1] == f'ckpt_path="{last}"'
    resumed = subprocess.run(command, cwd=stopped, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(whole, stopped, "triton", steps=10)


def test_runs_of_another_hidden_size_get_their_own_folder_and_ckpt_path_last_finds_it(tmp_path):
    assert train(tmp_path, "norm=reference", "model.hidden_dim=128").ok
    assert train(tmp_path, "norm=reference").ok  # newer, of the default hidden size 257
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "reference_seed0",
        "reference_seed0_hidden128",
    ]
    resumed = train(tmp_path, "norm=reference", "model.hidden_dim=128", "trainer.max_steps=5", "ckpt_path=last")
    assert resumed.ok and resumed.steps == 5  # the ended run extended: a branch beside it
    folder = tmp_path / "checkpoints/reference_seed0_hidden128"
    assert resumed.branched_from == f"{folder}/version_0/last.ckpt at step 4"
    assert resumed.checkpoint == str(folder / "version_1/final.ckpt")


def test_ckpt_path_last_takes_the_newest_checkpoint_of_this_configuration(tmp_path):
    # the batch size is not in the run name: both runs share the folder reference_seed0, in two versions
    assert train(tmp_path, "norm=reference").ok
    assert train(tmp_path, "norm=reference", "data.batch_size=16").ok  # newer
    resumed = train(tmp_path, "norm=reference", "trainer.max_steps=5", "ckpt_path=last")
    assert resumed.ok and resumed.steps == 5  # the ended run extended: a branch, version_2
    folder = tmp_path / "checkpoints/reference_seed0"
    assert resumed.branched_from == f"{folder}/version_0/last.ckpt at step 4"
    assert resumed.checkpoint == str(folder / "version_2/final.ckpt")


def test_a_resume_of_a_run_another_process_is_writing_exits_2_and_a_stale_lock_blocks_nothing(tmp_path, capsys):
    import fcntl

    assert train(tmp_path, "norm=reference").ok
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    (folder / "final.ckpt").unlink()  # a run that has not ended: a resume continues it in its own folder
    lock = folder / ".run.lock"
    assert not lock.exists()  # released and removed when the run ended
    before = files_under(tmp_path)
    with open(lock, "w") as held:  # another open file: the lock conflicts as another process's would
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SystemExit) as exit_:
            main(tmp_path, "norm=reference", "trainer.max_steps=5", "ckpt_path=last")
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"train.py: run in use: {folder} is being written by process 4242 (it holds {lock}); "
            "a run is resumed by one process at a time"
        )
        assert {p: b for p, b in files_under(tmp_path).items() if p != lock} == before
    assert lock.exists()  # as a killed holder leaves it: a file, but no lock
    resumed = train(tmp_path, "norm=reference", "trainer.max_steps=5", "ckpt_path=last")
    assert resumed.ok and resumed.steps == 5 and not lock.exists()


HOLD_LOCK = (
    "import fcntl, sys, time\n"
    "f = open(sys.argv[1], 'w'); f.write('holder\\n'); f.flush(); fcntl.flock(f, fcntl.LOCK_EX)\n"
    "print('locked', flush=True); time.sleep(600)\n"
)


@pytest.mark.slow
def test_a_lock_held_by_a_live_process_refuses_and_dies_with_it(tmp_path):
    assert train(tmp_path, "norm=reference").ok
    lock = tmp_path / "checkpoints/reference_seed0/version_0/.run.lock"
    lock.with_name("final.ckpt").unlink()  # a run that has not ended: a resume continues it in its own folder
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    args = [*SCHEDULE, "norm=reference", "trainer.max_steps=5", "ckpt_path=last"]
    refused = train_process(tmp_path, *args)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("train.py: run in use: ")
    holder.send_signal(signal.SIGKILL)  # no clean-up: the operating system releases the lock
    holder.wait()
    holder.stdout.close()
    resumed = train_process(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_checkpoint(lock.with_name("final.ckpt"))["global_step"] == 5


def test_sigterm_during_a_validation_pass_lets_it_end_and_the_resume_logs_every_value(tmp_path, monkeypatch):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    common = ["norm=reference", *RESUMABLE, "data.val_size=64"]  # 2 validation batches, at steps 4 and 8
    assert train(whole, *common).ok
    validation_step = RMSNormRegressor.validation_step

    def signalled(self, batch, batch_idx):
        out = validation_step(self, batch, batch_idx)
        if self.global_step == 4 and batch_idx == 0 and not self.trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGTERM)  # after the first of the two batches
        return out

    with monkeypatch.context() as m:
        m.setattr(RMSNormRegressor, "validation_step", signalled)
        with pytest.raises(SystemExit) as exit_:
            main(stopped, *common)
    assert exit_.value.code == 143
    assert read_checkpoint(checkpoint_of(stopped, "reference", "last.ckpt"))["global_step"] == 4
    assert main(stopped, *common, "ckpt_path=last").ok
    assert_same_training(whole, stopped, "reference", steps=10)  # val/mse of steps 4 and 8 included


def test_sigterm_during_the_step_before_a_validation_pass_lets_the_pass_run_and_counts_stay_exact(
    tmp_path, monkeypatch
):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    common = ["norm=triton", *RESUMABLE, "data.val_size=64"]  # 2 validation batches, at steps 4 and 8
    assert train(whole, *common).ok
    training_step = RMSNormRegressor.training_step

    def signalled(self, batch, batch_idx):
        out = training_step(self, batch, batch_idx)
        if self.global_step == 3:  # the step whose end validates (step 4 once it has ended)
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    with monkeypatch.context() as m:
        m.setattr(RMSNormRegressor, "training_step", signalled)
        with pytest.raises(SystemExit) as exit_:
            main(stopped, *common)
    assert exit_.value.code == 143
    ckpt = read_checkpoint(checkpoint_of(stopped, "triton", "last.ckpt"))
    assert ckpt["global_step"] == 4
    assert (ckpt["calls"]["train/forward"], ckpt["calls"]["train/backward"]) == (4, 4)  # no validation call among them
    resumed = main(stopped, *common, "ckpt_path=last")
    assert resumed.ok, resumed.failures  # the integration check counts 10 and 10
    assert_same_training(whole, stopped, "triton", steps=10)  # val/mse of steps 4 and 8 included


@pytest.mark.parametrize("source", ["last", "final.ckpt"])
def test_extending_a_finished_run_branches_and_keeps_its_final_checkpoint_and_test_mse(tmp_path, source):
    assert train(tmp_path, "norm=reference").ok  # 4 steps, ended
    before = files_under(tmp_path)
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    ckpt_path = "last" if source == "last" else str(folder / source)
    extended = train(tmp_path, "norm=reference", "trainer.max_steps=6", f"ckpt_path={ckpt_path}")
    assert extended.ok and extended.steps == 6
    assert {p: b for p, b in files_under(tmp_path).items() if p in before} == before  # nothing replaced
    assert extended.checkpoint == str(tmp_path / "checkpoints/reference_seed0/version_1/final.ckpt")
    assert extended.branched_from.endswith(" at step 4")
    assert read_checkpoint(folder / "final.ckpt")["global_step"] == 4
    first = read_scalars(tmp_path / "runs/reference_seed0/version_0")
    second = read_scalars(tmp_path / "runs/reference_seed0/version_1")
    assert [s for s, _ in first["test/mse"]] == [4] and [s for s, _ in second["test/mse"]] == [6]
    again = train(tmp_path, "norm=reference", "trainer.max_steps=7", "ckpt_path=last")  # the newest run: the branch
    assert again.branched_from == f"{tmp_path}/checkpoints/reference_seed0/version_1/last.ckpt at step 6"


@pytest.mark.parametrize("damaged", ["last.ckpt", "final.ckpt", "step00004.ckpt"])
def test_ckpt_path_last_refuses_a_damaged_newest_checkpoint_naming_it_and_never_steps_back(tmp_path, capsys, damaged):
    assert train(tmp_path, "norm=reference").ok  # version_0
    assert train(tmp_path, "norm=reference").ok  # version_1, the newest run
    folder = tmp_path / "checkpoints/reference_seed0/version_1"
    if damaged.startswith("step"):  # the furthest checkpoint, its step told by its name alone
        (folder / "last.ckpt").unlink()
        (folder / "final.ckpt").unlink()
    bad = folder / damaged
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    before = files_under(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, "norm=reference", "trainer.max_steps=6", "ckpt_path=last")
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("train.py: checkpoint error: ckpt_path=last: the ") and f"checkpoint {bad} is " in line
    assert line.endswith("pass ckpt_path=<file> to resume from another checkpoint")
    assert files_under(tmp_path) == before


def test_a_kill_between_two_checkpoint_writes_resumes_the_furthest_complete_one_in_the_same_run(
    tmp_path, tmp_path_factory, monkeypatch
):
    whole, _ = shared_run(tmp_path_factory, "norm=reference")
    every_step = ["norm=reference", "checkpoint.every_n_steps=1"]
    with monkeypatch.context() as m:
        crash_after_checkpoint_of_step(m, 3)
        with pytest.raises(Crash):
            train(tmp_path, *every_step)
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    shutil.copy(folder / "step00002.ckpt", folder / "last.ckpt")  # killed after step00003.ckpt, before last.ckpt
    resumed = train(tmp_path, *every_step, "ckpt_path=last")
    assert resumed.ok and resumed.steps == 4
    assert not resumed.branched_from and resumed.checkpoint == str(folder / "final.ckpt")  # the same run, continued
    assert sorted(p.name for p in (tmp_path / "checkpoints/reference_seed0").iterdir()) == ["version_0"]
    assert_same_training(whole, tmp_path, "reference", steps=4)


OTHER_DEVICE = "cpu" if torch.cuda.is_available() else "cuda"
#: Every setting of the configuration that changes the numbers a run produces (docs/training.md), a value
#: other than the shared run's, and the name the refusal gives it. Written out here, not read from the code.
RUN_IDENTITY = [
    ("norm.impl", ["norm=native"], "norm path"),
    ("norm.eps", ["norm.eps=1e-5"], "eps"),
    ("norm.fallback", ["norm.fallback=reference"], "norm_fallback"),
    ("model.kind", ["model=transformer"], "model.kind"),
    ("model.lr", ["model.lr=0.01"], "lr"),
    ("model.input_dim", ["model.input_dim=32"], "input_dim"),
    ("model.hidden_dim", ["model.hidden_dim=128"], "hidden_dim"),
    ("model.output_dim", ["model.output_dim=8"], "output_dim"),
    ("data.batch_size", ["data.batch_size=16"], "batch_size"),
    ("data.train_size", ["data.train_size=256"], "train_size"),
    ("data.val_size", ["data.val_size=64"], "val_size"),
    ("data.test_size", ["data.test_size=64"], "test_size"),
    ("data.noise", ["data.noise=0.1"], "noise"),
    ("data.seed", ["data.seed=7"], "seed"),
    ("seed", ["seed=3"], "shuffle_seed"),
    ("trainer.precision bf16-mixed", ["trainer.precision=bf16-mixed"], "trainer.precision"),
    ("trainer.precision bf16-true", ["trainer.precision=bf16-true"], "dtype"),
    ("compile", ["compile=true"], "compile"),
    ("trainer.deterministic", ["trainer.deterministic=false"], "trainer.deterministic"),
    ("trainer.accelerator", [f"trainer.accelerator={OTHER_DEVICE}"], "trainer.accelerator"),
    ("trainer.devices", ["trainer.devices=2", "trainer.strategy=ddp"], "processes"),
    ("trainer.num_nodes", ["trainer.num_nodes=2", "trainer.strategy=ddp"], "processes"),
]
#: The transformer's own sizes, against a transformer run.
TRANSFORMER_IDENTITY = [
    ("model.dim", ["model.dim=32"], "dim"),
    ("model.layers", ["model.layers=1"], "layers"),
    ("model.heads", ["model.heads=2"], "heads"),
    ("model.mlp_hidden", ["model.mlp_hidden=64"], "mlp_hidden"),
    ("model.seq_len", ["model.seq_len=16"], "seq_len"),
    ("model.qk_norm", ["model.qk_norm=true"], "qk_norm"),
]
#: Settings that change when a run checks, logs or saves, or where it writes, never its numbers: a resume may
#: change them.
NOT_RUN_IDENTITY = [
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=3",
    "trainer.enable_progress_bar=true",
    "checkpoint.every_n_steps=3",
    "parity.every_n_steps=0",
    "trainer.precision=32",  # Lightning's other name of 32-true
]


def resolving(root, *overrides):
    from rmsnorm_kernel.training.resume import resolve_resume
    from rmsnorm_kernel.training.run import build

    from .helpers import tiny_cfg

    cfg = tiny_cfg(root, *overrides)
    module, data = build(cfg)
    return resolve_resume(cfg, module, data)


@pytest.mark.parametrize(
    "base,setting,overrides,named",
    [("norm=reference", *case) for case in RUN_IDENTITY]
    + [("model=transformer", *case) for case in TRANSFORMER_IDENTITY],
    ids=[case[0] for case in RUN_IDENTITY + TRANSFORMER_IDENTITY],
)
def test_a_resume_with_another_value_of_a_setting_of_the_runs_identity_is_refused_naming_it(
    tmp_path_factory, base, setting, overrides, named
):
    from rmsnorm_kernel.training.checkpoints import CheckpointError

    from .helpers import shared_run

    root, _ = shared_run(tmp_path_factory, base, "norm=reference", "trainer.max_steps=2")
    (path,) = (root / "checkpoints").glob("*/version_0/last.ckpt")
    with pytest.raises(CheckpointError, match=rf"trained with {named} = .*; the configuration asks for"):
        resolving(root, base, "norm=reference", "trainer.max_steps=4", *overrides, f"ckpt_path={path}")


def test_a_resume_may_change_the_settings_outside_the_runs_identity(tmp_path_factory):
    from .helpers import shared_run

    root, _ = shared_run(tmp_path_factory, "norm=reference", "norm=reference", "trainer.max_steps=2")
    (path,) = (root / "checkpoints").glob("*/version_0/last.ckpt")
    for override in NOT_RUN_IDENTITY:
        resume = resolving(root, "norm=reference", "trainer.max_steps=4", override, f"ckpt_path={path}")
        assert resume.global_step == 2, override


def test_a_float32_run_resumed_in_mixed_precision_is_refused_by_ckpt_path_last_in_one_line(tmp_path, capsys):
    from .helpers import main

    assert main(tmp_path, "norm=reference", "trainer.max_steps=2").ok
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, "norm=reference", "ckpt_path=last", "trainer.precision=bf16-mixed")
    last = tmp_path / "checkpoints/reference_seed0/version_0/last.ckpt"
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train.py: checkpoint error: checkpoint {last} was trained with trainer.precision = '32-true'; "
        "the configuration asks for 'bf16-mixed'"
    )
