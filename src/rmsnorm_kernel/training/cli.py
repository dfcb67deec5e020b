"""The body of ``train.py``: one run, its summary, and one line on standard error when it fails.

Exit codes: 0 for a run that passed its checks, and for a resume that found nothing to train (one
line on standard output says so); 2 for a configuration, checkpoint or output path refused before any
work, and for a run whose checkpoint folder another live process is writing (its lock); 143 (SIGTERM) or
130 (SIGINT) for a run stopped by that signal, after writing ``last.ckpt`` (the line names it and the
command that resumes it); 1 for a run stopped by a non-finite loss, by a parity check past the tolerance
or by the Triton contract, or a failed check. In a multirun, a job that fails prints its
line and returns a ``RunResult`` whose ``stopped`` holds that line (an unexpected exception prints its
traceback too): the next job runs, and the exit code comes at the end, for all jobs
(``summary.MultirunSummary``). Hydra itself exits 1 for a value of the wrong type or an unknown key.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from ..ops.backend import backend
from ..ops.contract import ContractError
from .callbacks import Interrupted
from .checkpoints import CheckpointError, RunInUse
from .config import ConfigError
from .model import TrainingStopped
from .paths import PathError, run_name
from .run import RunResult, run
from .summary import format_summary

PROG = "train.py"


class JobFailed(RuntimeError):
    """A failed job of a multirun, with its one-line reason (see the module docstring)."""


def multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def fail(message: str, code: int) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    if multirun():
        raise JobFailed(message)
    sys.exit(code)


def hydra_value(text: str) -> str:
    """A value as Hydra's override grammar reads it: quoted when it holds anything beyond a plain path."""
    if re.fullmatch(r"[\w./+@:-]+", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def resume_command(checkpoint: Path) -> str:
    """The shell command that resumes this run from ``checkpoint``: the same overrides, that ckpt_path."""
    if HydraConfig.initialized():
        script = sys.argv[0] if sys.argv[0].endswith(PROG) else PROG  # as it was started
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("ckpt_path=")]
        args = [script, *overrides, f"ckpt_path={hydra_value(str(checkpoint))}"]
        return " ".join(["python", *map(shlex.quote, args)])
    # called without Hydra's command line (in-process): its overrides are not known here
    return f"python {PROG} <the same overrides> {shlex.quote('ckpt_path=' + hydra_value(str(checkpoint)))}"


def main(cfg: DictConfig) -> RunResult:
    """One run; a failed check exits non-zero (at the end of a multirun, after every run)."""
    if not multirun():
        return run_and_report(cfg)
    try:
        return run_and_report(cfg)
    except JobFailed as e:
        reason = str(e)
    except Exception as e:  # a crash: its traceback, then its line, and the next job
        traceback.print_exc()
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(f"{PROG}: {reason}", file=sys.stderr, flush=True)
    return RunResult(name=run_name(cfg), impl=cfg.norm.impl, seed=cfg.seed, backend=backend(), stopped=reason)


def run_and_report(cfg: DictConfig) -> RunResult:
    try:
        result = run(cfg)
    except ConfigError as e:
        fail(f"configuration error: {e}", 2)
    except CheckpointError as e:
        fail(f"checkpoint error: {e}", 2)
    except PathError as e:
        fail(f"path error: {e}", 2)
    except RunInUse as e:
        fail(f"run in use: {e}", 2)
    except TrainingStopped as e:  # a non-finite loss, parity past the tolerance
        fail(f"training stopped: {e}", 1)
    except Interrupted as e:
        code = 128 + getattr(signal, e.signal_name).value
        fail(f"{e}; resume with: {resume_command(e.checkpoint)}", code)
    except ContractError as e:
        fail(f"training stopped: {e} (norm.fallback=reference sends such inputs to the reference)", 1)
    if rank_zero_only.rank != 0:
        return result  # process 0 reports for all
    if result.nothing_to_do:
        print(f"{PROG}: nothing to do: {result.nothing_to_do}", flush=True)
        return result
    print(format_summary(result), flush=True)
    if not result.ok and not multirun():
        fail(f"check failed: {result.failures[0]}", 1)
    return result
