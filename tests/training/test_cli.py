"""``train.py``'s body: the summary, and one line on standard error with an exit code for each failure.

In-process through ``cli.main``; the slow test runs ``train.py`` itself for each exit path.
"""

import errno
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.types import RunMode

from rmsnorm_kernel.ops import launchers
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.training import cli
from rmsnorm_kernel.training.checkpoints import read_checkpoint
from tests.helpers import ROOT, train_process

from .helpers import SCHEDULE, block_mean_forward, full_disk_after, main

#: The options of the ``norm`` group (one conf/norm/<path>.yaml per path), as Hydra lists them: sorted.
NORMS = ", ".join(sorted(IMPLS))


def exits(tmp_path, capsys, *overrides):
    """Runs main; returns its exit code and the last line of standard error."""
    with pytest.raises(SystemExit) as exit_:
        main(tmp_path, *overrides)
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_a_run_that_passes_prints_its_summary(tmp_path, capsys):
    result = main(tmp_path, "norm=reference")
    out, err = capsys.readouterr()
    assert result.ok
    lines = out.splitlines()
    assert lines[-11] == "run reference_seed0: OK"
    assert lines[-1] == f"  checkpoint: {tmp_path}/checkpoints/reference_seed0/version_0/final.ckpt"
    assert "train.py:" not in err


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.max_steps=-5", "trainer.max_steps is -5; accepted: an integer >= 1"),
        ("data.batch_size=0", "data.batch_size is 0; accepted: an integer >= 1"),
    ],
)
def test_a_bad_value_exits_2_before_any_work(tmp_path, capsys, override, message):
    assert exits(tmp_path, capsys, override) == (2, f"train.py: configuration error: {message}")
    assert list(tmp_path.iterdir()) == []


def test_a_kernel_that_drifts_mid_run_stops_it_at_the_parity_step_with_one_line(tmp_path, capsys, monkeypatch):
    # correct for the first three backward calls (parity at step 0, training steps 0 and 1), then the
    # forward divides by BLOCK: the parity check at step 2 (every 2 steps on the tiny schedule) catches it
    backward, forward, done = launchers.rmsnorm_backward, launchers.rmsnorm_forward, []

    def counted_backward(*args, **kwargs):
        done.append(None)
        return backward(*args, **kwargs)

    def drifting_forward(*args, **kwargs):
        return (forward if len(done) < 3 else block_mean_forward)(*args, **kwargs)

    monkeypatch.setattr(launchers, "rmsnorm_backward", counted_backward)
    monkeypatch.setattr(launchers, "rmsnorm_forward", drifting_forward)
    code, line = exits(tmp_path, capsys, "norm=triton")
    assert code == 1
    assert line.startswith("train.py: training stopped: parity at step 2: the triton and reference paths differ by ")
    assert " times the float32 tolerance (atol 1e-05, rtol 0.0001), worst at the norm layer norm (" in line
    assert " times the tolerance), before that step changed any weight; " in line
    kept = Path(line.split("the last good checkpoint is ")[1])
    assert read_checkpoint(kept)["global_step"] == 2  # the state before the step the check stopped


def test_a_non_finite_loss_exits_1_naming_the_step_and_the_last_good_checkpoint(tmp_path, capsys):
    code, line = exits(tmp_path, capsys, "model.lr=1e30", "checkpoint.every_n_steps=1", "trainer.max_steps=20")
    assert code == 1
    assert line.startswith("train.py: training stopped: train/mse is ") and " at step " in line
    step = int(line.split(" at step ")[1].split(",")[0])
    kept = Path(line.split("the last good checkpoint is ")[1])
    ckpt = read_checkpoint(kept)
    assert 0 < step == ckpt["global_step"]
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


def test_a_shape_the_contract_refuses_exits_1_with_the_contract_message_and_the_remedy(tmp_path, capsys):
    code, line = exits(tmp_path, capsys, f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=3")
    assert code == 1
    assert line.startswith("train.py: training stopped: rmsnorm (triton): x has rows of")
    assert f"accepted: N <= {MAX_N}" in line and line.endswith(
        "(norm.fallback=reference sends such inputs to the reference)"
    )


def test_a_failed_check_exits_1_with_its_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    code, line = exits(tmp_path, capsys, "trainer.max_steps=2")
    assert code == 1
    assert line.startswith("train.py: check failed: initial parity: triton outputs differ from the reference by")


def test_in_a_multirun_a_failed_check_is_left_to_the_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    multirun = SimpleNamespace(initialized=lambda: True, get=lambda: SimpleNamespace(mode=RunMode.MULTIRUN))
    monkeypatch.setattr(cli, "HydraConfig", multirun)
    result = main(tmp_path, "trainer.max_steps=2")
    assert not result.ok
    out, err = capsys.readouterr()
    assert (
        "run triton_seed0: FAILED" in out
        and "  check failed: initial parity: triton outputs differ from the reference by" in out
    )
    assert "train.py:" not in err


MUTANT = (
    "import rmsnorm_kernel.ops.launchers as k, rmsnorm_kernel.testing.mutants as m\n"
    "k.rmsnorm_forward = lambda x, g, eps, *_, activation=None, **__: m.forward_block_mean(x, g, eps, activation)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,prelude,code,last_line",
    [
        (
            ["trainer.max_steps=-5"],
            None,
            2,
            "train.py: configuration error: trainer.max_steps is -5; accepted: an integer >= 1",
        ),
        (["ckpt_path=gone.ckpt"], None, 2, "train.py: checkpoint error: checkpoint {tmp}/gone.ckpt does not exist"),
        ([f"model.hidden_dim={MAX_N + 1}"], None, 1, "train.py: training stopped: rmsnorm (triton): x has rows of"),
        (["model.lr=1e30", "trainer.max_steps=20"], None, 1, "train.py: training stopped: train/mse is "),
        (
            ["parity.every_n_steps=0"],
            MUTANT,
            1,
            "train.py: check failed: initial parity: triton outputs differ from the reference by",
        ),
        ([], MUTANT, 1, "train.py: training stopped: parity at step 2: the triton and reference paths differ by"),
    ],
    ids=["config", "checkpoint", "contract", "non-finite", "check", "parity"],
)
def test_each_failure_exits_with_its_code_and_one_line(tmp_path, overrides, prelude, code, last_line):
    proc = train_process(tmp_path, *SCHEDULE, *overrides, prelude=prelude)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(last_line.format(tmp=tmp_path))
    if code == 2:  # refused before any work
        assert not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,line",
    [
        (
            "trainer.max_steps=many",
            "Error merging override trainer.max_steps=many; "
            "Value 'many' of type 'str' could not be converted to Integer",
        ),
        ("norm=cuda", f"In 'config': Could not find 'norm/cuda'; Available options in 'norm': {NORMS}"),
    ],
)
def test_a_value_hydra_refuses_exits_2_in_one_line_before_any_work(tmp_path, override, line):
    proc = train_process(tmp_path, override)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == f"train.py: configuration error: {line}"
    assert "Set the environment variable HYDRA_FULL_ERROR" not in proc.stderr  # Hydra's own report never ran
    assert not (tmp_path / "runs").exists() and not (tmp_path / "outputs").exists()


HYDRA_REFUSALS = [
    (["seed=abc"], "Error merging override seed=abc; Value 'abc' of type 'str' could not be converted to Integer"),
    (["foo=1"], "Could not override 'foo'.; To append to your config use +foo=1; Key 'foo' not in 'Config'"),
    (["seed=[1"], "no viable alternative at input '[1'"),
    (
        ["-m", "norm=reference,bogus", "seed=0,1"],
        f"In 'config': Could not find 'norm/bogus'; Available options in 'norm': {NORMS}",
    ),
    (
        ["-m", "norm=reference,triton", "trainer.max_steps=1,x"],
        "Error merging override trainer.max_steps=x; Value 'x' of type 'str' could not be converted to Integer",
    ),
]


@pytest.mark.parametrize("args,line", HYDRA_REFUSALS)
def test_hydras_refusal_of_an_override_is_one_line_naming_it_every_job_of_a_sweep_composed(args, line):
    assert cli.override_problem(args, ROOT / "conf") == line


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-m", "norm=reference,triton", "seed=3"],
        ["hydra.run.dir=/x", "trainer.max_steps=5"],
        ["--cfg", "job", "seed=abc"],  # Hydra's own options: Hydra reads the command line alone
    ],
)
def test_a_command_line_hydra_accepts_or_reads_itself_passes_the_precheck(args):
    assert cli.override_problem(args, ROOT / "conf") is None


@pytest.mark.parametrize("key", ["runs", "checkpoints"])
def test_an_output_folder_under_a_regular_file_exits_2_naming_it_and_leaves_nothing(tmp_path, capsys, key):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file\n")
    folder = blocker / "sub" / key
    code, line = exits(tmp_path, capsys, f"paths.{key}={folder}")
    assert (code, line) == (
        2,
        f"train.py: path error: paths.{key}: cannot create {folder}: {blocker} is a regular file, not a folder",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and blocker.read_text() == "a user's file\n"


def test_an_output_folder_that_cannot_be_written_exits_2_naming_it_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    from rmsnorm_kernel.training import paths

    real_open = open

    def refusing_open(file, *args, **kwargs):  # what a folder without write permission answers
        if Path(file).name.startswith(paths.PROBE_PREFIX) and Path(file).parent.name == "checkpoints":
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(paths, "open", refusing_open, raising=False)
    code, line = exits(tmp_path, capsys)
    assert (code, line) == (
        2,
        f"train.py: path error: paths.checkpoints: cannot write to {tmp_path}/checkpoints: Permission denied",
    )
    assert list(tmp_path.iterdir()) == []  # neither runs/ nor checkpoints/ is left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_folder_without_write_permission_exits_2(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        code, line = exits(tmp_path, capsys, f"paths.checkpoints={locked}")
    finally:
        locked.chmod(0o700)
    assert (code, line) == (2, f"train.py: path error: paths.checkpoints: cannot write to {locked}: Permission denied")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked"] and list(locked.iterdir()) == []


REFUSED = f"rmsnorm (triton): x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}"


def test_a_triton_run_where_every_step_fell_back_fails_naming_the_count_and_the_reason(tmp_path, capsys):
    code, line = exits(
        tmp_path, capsys, f"model.hidden_dim={MAX_N + 1}", "norm.fallback=reference", "trainer.max_steps=2"
    )
    assert code == 1
    assert line == (
        "train.py: check failed: integration: no training step ran on Triton: 2 of 2 norm calls in 2 steps fell "
        f"back to the reference (first reason: {REFUSED})"
    )


def test_the_reference_path_runs_at_a_shape_the_triton_contract_refuses_and_parity_says_it_skipped(tmp_path, capsys):
    result = main(tmp_path, "norm=reference", f"model.hidden_dim={MAX_N + 1}", "trainer.max_steps=2")
    assert result.ok and result.steps == 2
    assert result.parity_skipped == f"the Triton contract refuses this shape ({REFUSED})"
    assert result.metrics["parity/initial_output_err"] is None  # nothing was compared
    assert f"  initial parity: skipped: the Triton contract refuses this shape ({REFUSED})" in capsys.readouterr().out


def test_a_full_disk_writing_a_checkpoint_exits_1_with_one_line_naming_it_and_the_last_good_checkpoint(
    tmp_path, capsys, monkeypatch
):
    from rmsnorm_kernel import atomic

    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    with monkeypatch.context() as m:
        full_disk_after(m, atomic, "last.ckpt", writes=2)  # last.ckpt at step 4, after step00004.ckpt
        code, line = exits(tmp_path, capsys, "norm=reference")
    assert (code, line) == (
        1,
        f"train.py: run stopped: disk full: No space left on device, writing {folder}/last.ckpt; "
        f"the last good checkpoint is {folder}/step00004.ckpt",
    )
    assert "Traceback" not in capsys.readouterr().err
    assert read_checkpoint(folder / "last.ckpt")["global_step"] == 2  # the previous file, whole
    resumed = main(tmp_path, "norm=reference", "ckpt_path=last")  # continues the same run from step 4
    assert resumed.ok and not resumed.branched_from and resumed.checkpoint == str(folder / "final.ckpt")


def test_a_full_disk_writing_tensorboard_events_exits_1_with_one_line_and_the_last_good_checkpoint(
    tmp_path, capsys, monkeypatch
):
    from tensorboard.summary.writer.record_writer import RecordWriter

    from rmsnorm_kernel.training.model import RMSNormRegressor

    full, write, end = [], RecordWriter.write, RMSNormRegressor.on_train_batch_end

    def refusing_write(self, data):
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    def on_train_batch_end(self, *args):
        end(self, *args)
        if self.global_step == 3:
            full.append(True)

    monkeypatch.setattr(RecordWriter, "write", refusing_write)
    monkeypatch.setattr(RMSNormRegressor, "on_train_batch_end", on_train_batch_end)
    code, line = exits(tmp_path, capsys, "norm=reference")
    log_dir, folder = tmp_path / "runs/reference_seed0/version_0", tmp_path / "checkpoints/reference_seed0/version_0"
    assert code == 1
    assert line.startswith(
        f"train.py: run stopped: disk full: No space left on device, writing the TensorBoard event files in "
        f"{log_dir}; the last good checkpoint is {folder}/"
    )
    assert read_checkpoint(Path(line.split("the last good checkpoint is ")[1]))["global_step"] >= 2
    assert "Traceback" not in capsys.readouterr().err


def stop_at_step(monkeypatch, step, error):
    from rmsnorm_kernel.training.model import RMSNormRegressor

    end = RMSNormRegressor.on_train_batch_end

    def on_train_batch_end(self, *args):
        end(self, *args)
        if self.global_step == step:
            raise error

    monkeypatch.setattr(RMSNormRegressor, "on_train_batch_end", on_train_batch_end)


def test_a_crash_exits_1_with_one_line_naming_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    stop_at_step(monkeypatch, 3, RuntimeError("boom"))
    code, line = exits(tmp_path, capsys, "norm=reference")
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    assert (code, line) == (1, f"train.py: crashed: RuntimeError: boom; the last good checkpoint is {folder}/last.ckpt")


def test_a_resumed_run_stopped_before_its_first_checkpoint_names_the_checkpoint_it_resumed_from(
    tmp_path, capsys, monkeypatch
):
    from rmsnorm_kernel.training.model import NonFiniteLossError

    assert main(tmp_path, "norm=reference", "trainer.max_steps=2").ok
    source = tmp_path / "checkpoints/reference_seed0/version_0/last.ckpt"
    stop_at_step(monkeypatch, 3, NonFiniteLossError("train/mse is nan at step 3"))
    code, line = exits(tmp_path, capsys, "norm=reference", "ckpt_path=last")
    assert (code, line) == (
        1,
        f"train.py: training stopped: train/mse is nan at step 3; the last good checkpoint is {source} "
        "(the one this run resumed from)",
    )


def test_the_resume_command_starts_with_the_interpreter_that_ran_quoted_for_the_shell(monkeypatch):
    monkeypatch.setattr(cli.sys, "executable", "/opt/my python/bin/python3")
    assert cli.resume_command(Path("/runs/last.ckpt")) == (
        "'/opt/my python/bin/python3' train.py <the same overrides> ckpt_path=/runs/last.ckpt"
    )


def fake_multirun(monkeypatch):
    hydra = SimpleNamespace(mode=RunMode.MULTIRUN, overrides=SimpleNamespace(task=["norm=reference"]))
    monkeypatch.setattr(cli, "HydraConfig", SimpleNamespace(initialized=lambda: True, get=lambda: hydra))


def test_ctrl_c_in_a_multirun_stops_it_as_a_whole_with_exit_130_and_one_line(tmp_path, capsys, monkeypatch):
    from .helpers import signal_after_step

    fake_multirun(monkeypatch)
    signal_after_step(monkeypatch, 2, signal.SIGINT)
    with pytest.raises(SystemExit) as exit_:  # not a failed job that lets the next one start
        main(tmp_path, "norm=reference")
    assert exit_.value.code == 130
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("train.py:")]
    assert line.startswith("train.py: stopped by SIGINT at step 2; ")


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_final_test_exits_with_its_code_and_one_line_naming_the_last_good_checkpoint(
    tmp_path, capsys, monkeypatch, signum, code
):
    from rmsnorm_kernel.training.model import RMSNormRegressor

    monkeypatch.setattr(RMSNormRegressor, "on_test_start", lambda self: os.kill(os.getpid(), signum))
    before = signal.getsignal(signal.SIGTERM)
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    assert exits(tmp_path, capsys, "norm=reference") == (
        code,
        f"train.py: stopped by {signal.Signals(signum).name}; the last good checkpoint is {folder}/last.ckpt",
    )
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, 16-mixed runs as recorded")
def test_16_mixed_on_the_cpu_is_refused_before_any_work_naming_what_the_cpu_accepts(tmp_path, capsys):
    assert exits(tmp_path, capsys, "trainer.precision=16-mixed") == (
        2,
        "train.py: configuration error: trainer.precision is '16-mixed', which Lightning runs as bf16-mixed on "
        "the CPU; accepted on the CPU: 32-true, 32, bf16-mixed",
    )
    assert list(tmp_path.iterdir()) == []


CRASH = (
    "from rmsnorm_kernel.training.model import RMSNormRegressor as M\n"
    "def boom(self, *a):\n    raise RuntimeError('boom')\n"
    "M.on_train_batch_end = boom\n"
)
CTRL_C_AT_STEP_2 = (
    "import os, signal\nfrom rmsnorm_kernel.training.model import RMSNormRegressor as M\nend = M.on_train_batch_end\n"
    "def ctrl_c(self, *a):\n    end(self, *a)\n"
    "    if self.global_step == 2:\n        os.kill(os.getpid(), signal.SIGINT)\n"
    "M.on_train_batch_end = ctrl_c\n"
)


@pytest.mark.slow
def test_a_crash_in_train_py_is_one_line_with_its_traceback_in_the_hydra_folder(tmp_path):
    proc = train_process(tmp_path, *SCHEDULE, "norm=reference", prelude=CRASH)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert "Error executing job" not in proc.stderr and "Traceback" not in proc.stderr
    assert lines[-1].startswith("train.py: crashed: RuntimeError: boom (traceback in ")
    (trace,) = (tmp_path / "outputs/hydra").glob("*/traceback.txt")
    assert "RuntimeError: boom" in trace.read_text()


@pytest.mark.slow
def test_ctrl_c_in_a_multirun_process_exits_130_and_starts_no_further_job(tmp_path):
    proc = train_process(tmp_path, "-m", "norm=reference,triton", *SCHEDULE, prelude=CTRL_C_AT_STEP_2)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("train.py: stopped by SIGINT at step 2; ")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["reference_seed0"]


@pytest.mark.slow
def test_a_resume_with_nothing_to_do_writes_nothing_not_even_a_hydra_folder(tmp_path):
    assert train_process(tmp_path, *SCHEDULE, "norm=reference").returncode == 0
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    proc = train_process(tmp_path, *SCHEDULE, "norm=reference", "ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("train.py: nothing to do: ")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_multirun_flag_after_an_override_is_moved_before_the_overrides():
    assert cli.flags_first(["model=transformer", "-m", "norm=a,b"]) == ["-m", "model=transformer", "norm=a,b"]
    assert cli.flags_first(["seed=1", "--multirun"]) == ["--multirun", "seed=1"]
    assert cli.flags_first(["seed=1", "norm=triton"]) == ["seed=1", "norm=triton"]


def stop_then_finish(tmp_path, capsys, monkeypatch, where, signum, stopped_line):
    """Sends ``signum`` to this process at ``where`` (a setter given monkeypatch and the signal), expects
    the run to exit with its code and ``stopped_line`` (given the run's folder), then resumes it with
    ckpt_path=last: the resume finishes the run's end. Returns (the finishing result, the run's folder)."""
    folder = tmp_path / "checkpoints/reference_seed0/version_0"
    with monkeypatch.context() as m:
        where(m, signum)
        with pytest.raises(SystemExit) as exit_:
            main(tmp_path, "norm=reference")
    assert exit_.value.code == 128 + signum
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(stopped_line(folder)), folder
    assert not (folder / "end.json").exists()
    finished = main(tmp_path, "norm=reference", "ckpt_path=last")
    assert finished.ok and not finished.nothing_to_do, finished.failures
    assert "run reference_seed0: OK" in capsys.readouterr().out  # the summary
    assert main(tmp_path, "norm=reference", "ckpt_path=last").nothing_to_do  # now it is done
    return finished, folder


def kill_at(signum):
    return lambda *args, **kwargs: os.kill(os.getpid(), signum)


def signal_in_on_train_end(m, signum):
    from rmsnorm_kernel.training.model import RMSNormRegressor

    m.setattr(RMSNormRegressor, "on_train_end", kill_at(signum), raising=False)


def signal_writing_final(m, signum):
    from rmsnorm_kernel.training.checkpoints import AtomicCheckpointIO

    save = AtomicCheckpointIO.save_checkpoint

    def saving(self, checkpoint, path, storage_options=None):
        if Path(path).name == "final.ckpt":
            os.kill(os.getpid(), signum)
        save(self, checkpoint, path, storage_options)

    m.setattr(AtomicCheckpointIO, "save_checkpoint", saving)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("where", [signal_in_on_train_end, signal_writing_final], ids=["on_train_end", "final.ckpt"])
def test_a_signal_after_the_last_step_is_held_until_final_and_last_are_written_then_a_resume_finishes_the_run(
    tmp_path, capsys, monkeypatch, where, signum
):
    name = signal.Signals(signum).name
    finished, folder = stop_then_finish(
        tmp_path / "stopped",
        capsys,
        monkeypatch,
        where,
        signum,
        lambda folder: f"train.py: stopped by {name} at step 4; {folder}/last.ckpt holds that step; resume with: ",
    )
    assert read_checkpoint(folder / "final.ckpt")["global_step"] == read_checkpoint(folder / "last.ckpt")["global_step"]
    straight = main(tmp_path / "straight", "norm=reference")
    assert finished.metrics["test/mse"] == straight.metrics["test/mse"]
    assert finished.metrics["train/mse"] == straight.metrics["train/mse"]  # read back from its TensorBoard run
    assert finished.metrics["val/mse"] == straight.metrics["val/mse"]
    assert finished.metrics["reload/max_abs_diff"] == 0.0


def signal_at_test_start(m, signum):
    from rmsnorm_kernel.training.model import RMSNormRegressor

    m.setattr(RMSNormRegressor, "on_test_start", kill_at(signum))


def signal_in_the_summary(m, signum):
    format_summary = cli.format_summary

    def formatting(result):
        os.kill(os.getpid(), signum)
        return format_summary(result)

    m.setattr(cli, "format_summary", formatting)


@pytest.mark.parametrize("where", [signal_at_test_start, signal_in_the_summary], ids=["test", "summary"])
def test_a_run_stopped_during_its_final_test_or_summary_is_finished_by_ckpt_path_last_not_nothing_to_do(
    tmp_path, capsys, monkeypatch, where
):
    stop_then_finish(
        tmp_path,
        capsys,
        monkeypatch,
        where,
        signal.SIGTERM,
        lambda folder: f"train.py: stopped by SIGTERM; the last good checkpoint is {folder}/last.ckpt",
    )


MADE_UP = "integration: a made-up failure"


def test_asking_again_for_a_run_whose_end_check_failed_exits_1_with_its_line(tmp_path, capsys, monkeypatch):
    from rmsnorm_kernel.training import run as run_module

    with monkeypatch.context() as m:
        m.setattr(run_module, "failed_checks", lambda *args, **kwargs: [MADE_UP])
        assert exits(tmp_path, capsys, "norm=reference") == (1, f"train.py: check failed: {MADE_UP}")
    assert exits(tmp_path, capsys, "norm=reference", "ckpt_path=last") == (1, f"train.py: check failed: {MADE_UP}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_first_step_stops_the_command_at_once_and_writes_no_checkpoint(
    tmp_path, capsys, monkeypatch, signum
):
    from .helpers import signal_after_step

    signal_after_step(monkeypatch, 1, signum)
    before = signal.getsignal(signal.SIGTERM)
    assert exits(tmp_path, capsys, "norm=reference") == (
        128 + signum,
        f"train.py: stopped by {signal.Signals(signum).name}; no checkpoint had been written yet",
    )
    assert not list((tmp_path / "checkpoints").rglob("*.ckpt"))
    assert signal.getsignal(signal.SIGTERM) is before


#: Run first in train.py's interpreter: one second into the first training step, which compiles the network
#: (compile=true), another thread sends the process SIGTERM and writes down when.
SIGTERM_WHILE_COMPILING = (
    "import os, signal, threading, time\nfrom rmsnorm_kernel.training.model import RMSNormRegressor as M\n"
    "step = M.training_step\n"
    "def kill():\n    open('signalled', 'w').write(repr(time.time()))\n    os.kill(os.getpid(), signal.SIGTERM)\n"
    "def compiling(self, *a):\n    if self.global_step == 0:\n        threading.Timer(1.0, kill).start()\n"
    "    return step(self, *a)\n"
    "M.training_step = compiling\n"
)


@pytest.mark.slow
def test_sigterm_while_compile_compiles_ends_the_command_within_seconds_with_one_line(tmp_path):
    import time

    proc = train_process(
        tmp_path,
        *SCHEDULE,
        "model=transformer",
        "norm=reference",
        "compile=true",
        prelude=SIGTERM_WHILE_COMPILING,
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},  # nothing compiled yet: it compiles
    )
    ended = time.time()
    assert proc.returncode == 143, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("train.py:")]
    assert lines == ["train.py: stopped by SIGTERM; no checkpoint had been written yet"]
    assert ended - float((tmp_path / "signalled").read_text()) < 5.0  # compiling alone takes longer
    assert not list((tmp_path / "checkpoints").rglob("*.ckpt"))
