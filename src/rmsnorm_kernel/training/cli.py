"""The body of ``train.py``: one run, its summary, and one line on standard error when it fails.

Every abnormal end is one line (``train.py: <cause>``, naming the last good checkpoint where there is one)
and a non-zero exit:

- 2: a configuration, checkpoint or output path refused before any work, and a run whose checkpoint
  folder another live process is writing (its lock);
- 143 (SIGTERM) or 130 (SIGINT): a run stopped by that signal. During training and until ``final.ckpt``
  and ``last.ckpt`` are written, after writing ``last.ckpt`` (the line names it and the command that
  resumes it); at any other moment (set-up, the final test, the summary, between the jobs of a multirun)
  at once, naming the last good checkpoint. A run stopped after its last step is finished by
  ``ckpt_path=last`` (``resume.END_RECORD``). A signal stops a multirun as a whole: no further job starts;
- 1: a run stopped by a non-finite loss, by a parity check past the tolerance, by the Triton contract or
  by a write the disk refused (a full disk: ``run.OutputError``), a failed check, and a crash (an
  unexpected exception: its traceback goes to ``traceback.txt`` in the Hydra folder, or to standard error
  without one; ``HYDRA_FULL_ERROR=1`` lets it through).

In a multirun, a job that fails (other than by a signal) prints its line and returns a ``RunResult``
whose ``stopped`` holds that line: the next job runs, and the exit code comes at the end, for all jobs
(``summary.MultirunSummary``). A value of the wrong type, an unknown key or group option is refused
before Hydra starts (``override_problem``), in one line, exit 2.

A resume that finds nothing to train exits 0 with one line on standard output (1, with the check's line,
when the run's recorded end failed a check), and writes nothing: the Hydra folder of that invocation is
removed again (``HydraFolders``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback as HydraCallback
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from ..ops.backend import backend
from ..ops.contract import ContractError
from ..signals import Stopped, exit_status, stop_the_command
from .checkpoints import CheckpointError, RunInUse
from .config import ConfigError
from .faults import OutputError
from .model import TrainingStopped
from .on_signal import Interrupted
from .paths import PathError, run_name
from .result import RunResult
from .resume import record_end
from .run import run
from .summary import format_summary

PROG = "train.py"
#: The file in the Hydra job folder that holds a crash's traceback (``checks.clean`` knows it by this name).
TRACEBACK_NAME = "traceback.txt"


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
    """The shell command that resumes this run from ``checkpoint``: the interpreter that runs this one
    (``sys.executable``), the same script and overrides, that ckpt_path; each quoted for the shell."""
    python = shlex.quote(sys.executable or "python")
    if HydraConfig.initialized():
        script = sys.argv[0] if sys.argv[0].endswith(PROG) else PROG  # as it was started
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("ckpt_path=")]
        args = [script, *overrides, f"ckpt_path={hydra_value(str(checkpoint))}"]
        return " ".join([python, *map(shlex.quote, args)])
    # called without Hydra's command line (in-process): its overrides are not known here
    return f"{python} {PROG} <the same overrides> {shlex.quote('ckpt_path=' + hydra_value(str(checkpoint)))}"


#: Hydra's own options of the command line; with any of them, Hydra reads the command line alone.
HYDRA_FLAGS = ("-m", "--multirun")


def flags_first(args: list[str]) -> list[str]:
    """``args`` with ``HYDRA_FLAGS`` moved before the overrides: Hydra's parser refuses an override after
    ``-m`` that follows another override (``model=transformer -m norm=a,b``), which reads the same."""
    return [a for a in args if a in HYDRA_FLAGS] + [a for a in args if a not in HYDRA_FLAGS]


def override_problem(args: list[str], config_dir: Path) -> str | None:
    """Hydra's refusal of the command line's overrides (a value of the wrong type, an unknown key or group
    option, a syntax error) as one line, or None when every job of the command composes.

    ``train.py`` asks before Hydra starts, so that such a mistake is one line and exit 2 like every other
    configuration error, not Hydra's several lines and exit 1. Each value of a sweep (``norm=a,b``) is
    composed once, with the first value of every other sweep. Overrides of Hydra's own settings
    (``hydra.*``) and a command line with other Hydra options (``--help``, ``--cfg``...) are left to Hydra.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(a.startswith("-") and a not in HYDRA_FLAGS for a in args):
        return None
    lines = [a for a in args if a not in HYDRA_FLAGS and not a.lstrip("+~").startswith("hydra.")]
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
        sweeps = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
    except Exception as e:
        return hydra_message(e)
    first = [f"{o.get_key_element()}={sweeps[i][0]}" if i in sweeps else o.input_line for i, o in enumerate(parsed)]
    jobs = [first] + [
        [f"{parsed[i].get_key_element()}={v}" if j == i else line for j, line in enumerate(first)]
        for i, values in sweeps.items()
        for v in values[1:]
    ]
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        for job in jobs:
            try:
                compose(config_name="config", overrides=job)
            except Exception as e:
                return hydra_message(e)
    return None


def hydra_message(e: BaseException) -> str:
    """Hydra's and OmegaConf's several-line messages (the exception and its causes) as one line."""
    parts = []
    while e is not None:
        for line in str(e).splitlines():
            line = line.strip()
            if line.startswith(("Config search path", "Set the environment variable", "See https://")):
                break
            if line and not line.startswith(("full_key:", "reference_type=", "object_type=")):
                parts.append(line)
        e = e.__cause__
    text = "; ".join(dict.fromkeys(parts)).replace(":; ", ": ")
    return re.sub(
        r"(Available options in '[^']*': )([^;\s]+(?:; [^;\s]+)*)", lambda m: m[1] + m[2].replace("; ", ", "), text
    )


def main(cfg: DictConfig) -> RunResult:
    """One run; a failed check exits non-zero (at the end of a multirun, after every run)."""
    try:
        with stop_the_command():
            if not multirun():
                return run_and_report(cfg)
            try:
                return run_and_report(cfg)
            except JobFailed as e:
                reason = str(e)
            except Exception as e:  # a crash: its line, and the next job
                reason = crashed(e)
    except (Stopped, KeyboardInterrupt) as e:
        name = e.signal_name if isinstance(e, Stopped) else "SIGINT"
        last = getattr(e, "last_good", None)
        print(f"{PROG}: stopped by {name}" + (f"; {last}" if last else ""), file=sys.stderr, flush=True)
        sys.exit(exit_status(name))  # in a multirun too: no further job starts
    return RunResult(name=run_name(cfg), impl=cfg.norm.impl, seed=cfg.seed, backend=backend(), stopped=reason)


def crashed(e: Exception) -> str:
    """An unexpected exception as one line (its traceback in the Hydra folder), printed; returns the line."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    reason = f"crashed: {type(e).__name__}: {first}"
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if HydraConfig.initialized():
        path = Path(HydraConfig.get().runtime.output_dir) / TRACEBACK_NAME
        try:
            path.write_text(text)
            reason += f" (traceback in {path})"
        except OSError:
            print(text, file=sys.stderr, end="", flush=True)
    else:
        print(text, file=sys.stderr, end="", flush=True)
    if getattr(e, "last_good", None):
        reason += f"; {e.last_good}"
    print(f"{PROG}: {reason}", file=sys.stderr, flush=True)
    return reason


def run_and_report(cfg: DictConfig) -> RunResult:
    try:
        result = run(cfg, record=False)  # recorded below, once the summary is out
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
    except OutputError as e:  # a full disk
        fail(f"run stopped: {e}", 1)
    except Interrupted as e:  # a signal stops a multirun as a whole
        print(f"{PROG}: {e}; resume with: {resume_command(e.checkpoint)}", file=sys.stderr, flush=True)
        sys.exit(exit_status(e.signal_name))
    except ContractError as e:
        fail(f"training stopped: {e} (norm.fallback=reference sends such inputs to the reference)", 1)
    except Exception as e:
        if multirun():
            raise
        crashed(e)
        sys.exit(1)
    if rank_zero_only.rank != 0:
        return result  # process 0 reports for all
    if result.nothing_to_do:
        HydraFolders.remove_this_invocations()
        print(f"{PROG}: nothing to do: {result.nothing_to_do}", flush=True)
        if not result.ok and not multirun():  # the run's end failed a check: so does asking again
            fail(f"check failed: {result.failures[0]}", 1)
        return result
    try:
        print(format_summary(result), flush=True)
        # the run's end is done once its summary is out: until then, ckpt_path=last finishes it
        record_end(Path(result.checkpoint).parent, result.steps, result.failures)
    except Stopped as e:  # the line names the checkpoint that ckpt_path=last finishes the run from
        e.last_good = f"the last good checkpoint is {Path(result.checkpoint).with_name('last.ckpt')}"
        raise
    if not result.ok and not multirun():
        fail(f"check failed: {result.failures[0]}", 1)
    return result


class HydraFolders(HydraCallback):
    """Records, before Hydra creates a single run's output folder, which of its folders did not exist
    yet; ``remove_this_invocations`` removes them again (a resume with nothing to do writes nothing).
    Listed in ``conf/config.yaml``'s ``hydra.callbacks``."""

    created: list[Path] = []  # the run folder and the parents it adds, outermost first

    def on_run_start(self, config, **kwargs) -> None:
        folder = Path(str(config.hydra.run.dir))
        folder = folder if folder.is_absolute() else Path.cwd() / folder
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        HydraFolders.created = missing[::-1]

    @staticmethod
    def remove_this_invocations() -> None:
        if not HydraConfig.initialized() or multirun() or not HydraFolders.created:
            return
        *parents, own = HydraFolders.created
        if Path(HydraConfig.get().runtime.output_dir).resolve() != own.resolve():
            return
        shutil.rmtree(own, ignore_errors=True)
        for p in reversed(parents):
            try:
                p.rmdir()  # only if empty: another invocation may be writing beside this one
            except OSError:
                break
        HydraFolders.created = []
