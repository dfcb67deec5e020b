"""What several test modules share: the device, the training configuration, and a runner for the
command lines whose process is itself under test."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmsnorm_kernel.ops.backend import interpreter_problem, kernel_device_type

ROOT = Path(__file__).resolve().parents[1]
DEVICE = kernel_device_type()
QUIET = ["trainer.enable_progress_bar=false"]
#: The environment of a process that sees no GPU, also on a GPU machine.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
#: Why this machine's Triton and NumPy cannot run the interpreter (the package refuses at import), or None.
INTERPRETER_PROBLEM = interpreter_problem(importlib.metadata.version("triton"), importlib.metadata.version("numpy"))
needs_a_working_interpreter = pytest.mark.skipif(
    INTERPRETER_PROBLEM is not None, reason="this Triton's interpreter cannot run with this NumPy"
)


def compose_cfg(overrides=()):
    """The training configuration as ``train.py`` composes it, in-process (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_process(tmp_path, *overrides, prelude=None, timeout=900, env=None):
    """Runs ``train.py`` in a fresh interpreter, in tmp_path; returns the completed process.
    ``prelude``: Python run first in that interpreter (to patch the package before training); ``env``:
    environment variables set for it."""
    args = [*overrides, *QUIET]
    if prelude is None:
        cmd = [sys.executable, str(ROOT / "train.py"), *args]
    else:
        argv = [str(ROOT / "train.py"), *args]
        code = f"{prelude}\nimport runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')"
        cmd = [sys.executable, "-c", code]
    return subprocess.run(
        cmd,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` of a process a test sends SIGINT: Ctrl+C's default disposition, as in a terminal. A
    shell that runs the tests as a background job ignores SIGINT, and the child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_process(argv, signum: int, wait_for: str, cwd, settle_s: float = 0.0) -> tuple[int, str, str]:
    """Starts ``argv`` in ``cwd``, sends ``signum`` once ``wait_for`` is printed (and ``settle_s`` later);
    returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        preexec_fn=ctrl_c_as_in_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen, deadline = "", time.monotonic() + 120
    while wait_for not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    time.sleep(settle_s)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, seen + out, err


def markdown_rows(text: str) -> list[list[str]]:
    """The rows of the Markdown tables in ``text`` (header rows too, separator rows left out), each as its
    cells without their padding: what a table says, whatever its column widths."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(c and set(c) <= set("-:") for c in cells):
            continue
        rows.append(cells)
    return rows


#: Keywords of a launch that are options of the launch, not parameters of the kernel.
LAUNCH_OPTIONS = {"num_warps", "num_stages"}


def launch_checking_parameters(kernel):
    """A ``launch`` for the launchers (or a stand-in for a kernel) that refuses a keyword the kernel does
    not declare: Triton's interpreter ignores one, a GPU's compile refuses it."""

    class Checked:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                unknown = set(kwargs) - set(kernel.arg_names) - LAUNCH_OPTIONS
                assert not unknown, f"{kernel.fn.__name__} has no parameter {sorted(unknown)}"
                return kernel[grid](*args, **kwargs)

            return run

    return Checked()
