"""The command-line layer (``checks.cli``): Ctrl+C and SIGTERM end any command in one line with 130 or
143, a write the disk refuses ends it in one line with 1, and one-line usage mistakes with bounded numbers."""

import errno
import signal
import sys

import pytest

from rmsnorm_kernel.checks.cli import OneLineParser, at_least, run_interruptible
from tests.helpers import interrupt_process

from .helpers import WORK, patch_work, run_cli

# --------------------------------------------------------------------------------------------------
# Ctrl+C, SIGTERM and refused writes


@pytest.mark.parametrize("command", sorted(WORK))
@pytest.mark.parametrize("exc, status, name", [(KeyboardInterrupt, 130, "SIGINT"), ("Terminated", 143, "SIGTERM")])
def test_ctrl_c_or_sigterm_in_any_command_ends_in_one_line_and_130_or_143(
    command, exc, status, name, tmp_path, capsys, monkeypatch
):
    from rmsnorm_kernel.checks import cli

    monkeypatch.chdir(tmp_path)
    error = getattr(cli, exc) if isinstance(exc, str) else exc

    def interrupted(*args, **kwargs):
        raise error()

    patch_work(monkeypatch, command, interrupted)
    argv = WORK[command][0] + ([] if command == "clean" else ["--outputs", tmp_path / "o"])
    rc, out, err = run_cli(capsys, *argv)
    assert rc == status
    assert err.strip().splitlines() == [f"rmsnorm-kernel {command}: stopped by {name}; exit status {status}"]
    assert "Traceback" not in out + err


def test_sigterm_is_the_default_again_after_a_command(tmp_path, capsys, monkeypatch):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    patch_work(monkeypatch, "exercise", lambda: [])
    run_cli(capsys, "exercise", "--outputs", tmp_path)
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.slow
# commands that run for seconds on a GPU too, so that the signal finds them running
@pytest.mark.parametrize("command, sig, status", [("check-forward", "SIGINT", 130), ("check-backward", "SIGTERM", 143)])
def test_a_signal_to_a_running_command_ends_it_in_one_line(command, sig, status, tmp_path):
    argv = [sys.executable, "-m", "rmsnorm_kernel", command, "--outputs", str(tmp_path / "o")]
    rc, out, err = interrupt_process(argv, getattr(signal, sig), "==", tmp_path)  # "==": the work started
    assert rc == status, (out, err)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"rmsnorm-kernel {command}: stopped by {sig}; exit status {status}"


@pytest.mark.parametrize(
    "error, line",
    [
        (OSError(errno.ENOSPC, "No space left on device", "out/r.json"), "disk full: No space left on device"),
        (OSError(errno.EROFS, "Read-only file system", "out/r.json"), "write failed: Read-only file system"),
    ],
)
def test_a_write_the_disk_refuses_ends_a_command_in_one_line_with_exit_1(error, line, capsys):
    def body():
        raise error

    assert run_interruptible("cmd", body) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cmd: {line}, writing out/r.json; exit status 1"]


def test_any_other_os_error_is_not_taken_for_a_refused_write():
    def body():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "missing.json")

    with pytest.raises(FileNotFoundError):
        run_interruptible("cmd", body)


# --------------------------------------------------------------------------------------------------
# Usage mistakes


def test_a_command_line_mistake_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="prog")
    parser.add_argument("--samples", type=at_least(1), default=1)
    parser.add_argument("--ms", type=at_least(0.5, float), default=1.0)
    assert parser.parse_args(["--samples", "3", "--ms", "0.5"]).samples == 3
    for argv, words in (
        (["--samples", "0"], "argument --samples: 0 is too small; accepted: 1 or more"),
        (["--samples", "1.5"], "argument --samples: '1.5' is not a number; accepted: 1 or more"),
        (["--ms", "nan"], "argument --ms: 'nan' is not a finite number; accepted: 0.5 or more"),
        (["--ms", "inf"], "argument --ms: 'inf' is not a finite number; accepted: 0.5 or more"),
        (["--fast"], "unrecognized arguments: --fast"),
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2 and capsys.readouterr().err == f"prog: {words}\n"
