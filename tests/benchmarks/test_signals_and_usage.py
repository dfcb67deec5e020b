"""Every command of ``benchmarks/``: Ctrl+C and SIGTERM end it in one line with 130 or 143, and a usage
mistake is one line with exit status 2 before any work."""

import signal
import sys

import pytest
import torch

from benchmarks import benchmark, host_time, launch_rules, launch_sweep, train_step, transformer_step
from benchmarks.common import Terminated
from benchmarks.sweep import run as sweep
from tests.helpers import ROOT, interrupt_process

#: Each command: its main, the name its lines start with, and a step of its work to interrupt.
COMMANDS = {
    "benchmark": (benchmark, "benchmark", "run_benchmark"),  # the GPU run and the CPU smoke both call it
    "sweep": (sweep, "sweep", "sweep_points"),
    "launch_rules": (launch_rules, "launch_rules", "parse_items"),
    "launch_sweep": (launch_sweep, "launch_sweep", "cannot_start"),
    "host_time": (host_time, "host_time", "cannot_start"),
    "train_step": (train_step, "train_step", "cannot_start"),
    "transformer_step": (transformer_step, "transformer_step", "cannot_start"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("exc, status, name", [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")])
def test_ctrl_c_or_sigterm_ends_each_command_in_one_line(command, exc, status, name, tmp_path, capsys, monkeypatch):
    module, prog, step = COMMANDS[command]

    def interrupted(*args, **kwargs):
        raise exc()

    monkeypatch.setattr(module, step, interrupted)
    argv = ["--shapes", "tiny"] if command == "sweep" else []
    if command in ("benchmark", "sweep"):
        argv += ["--outputs", str(tmp_path / "o")]
    assert module.main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"{prog}: stopped by {name}; exit status {status}"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is the command's only


@pytest.mark.parametrize("command", ["launch_rules", "launch_sweep", "host_time", "train_step", "transformer_step"])
@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_a_json_file_that_cannot_be_written_is_refused_before_any_work(command, where, tmp_path, capsys):
    module, prog, _ = COMMANDS[command]
    (tmp_path / "a_file").write_text("kept")
    path = tmp_path if where == "folder" else tmp_path / "a_file" / "x.json"
    assert module.main(["--json", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: --json {path}") and "accepted" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a command refused for want of a GPU")
@pytest.mark.parametrize("command", ["launch_rules", "launch_sweep", "host_time", "train_step", "transformer_step"])
def test_a_command_refused_later_leaves_no_folder_of_its_json_behind(command, tmp_path, capsys):
    """The --json check creates nothing; the folders are made with the file, if it is ever written."""
    module, _, _ = COMMANDS[command]
    assert module.main(["--json", str(tmp_path / "new" / "deeper" / "r.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command, argv",
    [
        ("launch_rules", ["--fast"]),
        ("launch_sweep", ["--samples", "-1"]),
        ("launch_sweep", ["--warmup", "-3"]),
        ("host_time", ["--repeats", "0"]),
        ("train_step", ["--steps", "0"]),
        ("transformer_step", ["--modes", "max-autotune"]),
        ("benchmark", ["--impls", ","]),
        ("benchmark", ["--samples", "-1"]),
        ("sweep", ["--impls", ","]),
        ("sweep", ["--rep-ms", "0"]),
    ],
)
def test_every_usage_mistake_is_one_line_and_exit_2(command, argv, capsys):
    module, _, _ = COMMANDS[command]
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("python -m benchmarks."), err


@pytest.mark.slow
def test_sigint_to_a_whole_sweep_stops_it_in_one_line_with_130(tmp_path):
    argv = [sys.executable, "-m", "benchmarks.sweep", "--shapes", "tiny", "--outputs", str(tmp_path / "o")]
    rc, out, err = interrupt_process(argv, signal.SIGINT, "writing", ROOT)
    assert rc == 130, (out, err)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("sweep: stopped by SIGINT")
