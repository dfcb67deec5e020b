"""A command stopped while it starts, or while it shuts down: processes under test, so run as processes.

While torch imports (seconds), Ctrl+C or SIGTERM ends a command with one line and 130 or 143
(``rmsnorm_kernel.signals``); once the command has decided its exit status, a late signal leaves it as
it is (``signals.command_takes_over``)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.sweep.points import sweep_points
from tests.benchmarks.helpers import sweep_run, tiny_rows
from tests.helpers import ROOT, ctrl_c_as_in_a_terminal

#: Well inside the imports (torch alone takes longer), well after Python itself started.
WHILE_STARTING_S = 0.5


def _stopped_while_starting(argv, sig):
    proc = subprocess.Popen(
        argv, cwd=ROOT, preexec_fn=ctrl_c_as_in_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(WHILE_STARTING_S)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, [line for line in err.splitlines() if "no CUDA device found" not in line]


@pytest.mark.slow
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "argv, prog",
    [
        (["-m", "benchmarks.residual_add", "--help"], "python -m benchmarks.residual_add"),
        (["-m", "rmsnorm_kernel", "--help"], "python -m rmsnorm_kernel"),
        (["train.py", "--help"], "train.py"),
    ],
    ids=["benchmarks", "check commands", "train.py"],
)
def test_a_signal_while_a_command_starts_is_one_line_and_its_status(argv, prog, sig, status):
    rc, err = _stopped_while_starting([sys.executable, *argv], sig)
    assert rc == status and err == [f"{prog}: stopped by {sig.name} while starting; nothing was done"]


@pytest.mark.slow
def test_a_signal_after_a_command_decided_its_status_leaves_that_status(tmp_path):
    """The signal comes from the process itself while Python shuts down (an ``atexit`` hook installed by a
    ``sitecustomize``), so it lands after the command's work whatever the machine's speed."""
    run = tmp_path / "run.json"
    ids = [p.id for p in sweep_points("tiny")]
    run.write_text(json.dumps(sweep_run([r for i in ids for r in tiny_rows(i)], shapes="tiny")))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, os, signal\natexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
    )
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "benchmarks.sweep", "--merge", str(run), "--outputs", str(tmp_path / "out")]
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        preexec_fn=ctrl_c_as_in_a_terminal,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert "wrote " in proc.stdout  # the merge ran to its end
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "no CUDA device found" not in line] == []
