"""Resuming a run: the checkpoint ``ckpt_path`` names, checked before anything is written, and the
TensorBoard marker that keeps one value per step across the interruption.

A resume never rewrites a run's history:

- a checkpoint already at or past ``trainer.max_steps`` leaves nothing to train (``Resume.done``), unless
  it is the last step's checkpoint of a run that stopped before its end was recorded (``END_RECORD``:
  a signal, a crash during the end's writes, the test, the checks or the summary): then the run's end
  (``final.ckpt`` where it is missing, the test, the checks, HPARAMS, the summary) is done, in its folders;
- a checkpoint of a run that has gone further (a later checkpoint in its folder) or that has ended (a
  ``final.ckpt`` in its folder) starts a new version folder, a branch (``Resume.branch``), which records
  where it came from; the run it came from keeps its checkpoints, its final result and its TensorBoard
  history. Extending a finished run with a larger ``trainer.max_steps`` is such a branch;
- otherwise the run continues in its own folders, from the step of the checkpoint.

``ckpt_path=last`` is the furthest checkpoint (``step*.ckpt``, ``last.ckpt``, ``final.ckpt``) of the
newest run of this configuration; a damaged file there is an error naming it, never a step back.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from .checkpoints import CheckpointError, check_matches, checkpoint_steps, read_checkpoint
from .config import count_devices
from .data import SplitData
from .events import run_event_writer
from .model import RMSNormRegressor
from .network import NETWORK_DEFAULTS
from .paths import project_path, run_name

#: The file of a run's checkpoint folder that records its end: written once the test, the end checks,
#: reload parity, HPARAMS and the summary are done (``record_end``), with the checks that failed.
END_RECORD = "end.json"


def record_end(folder: Path, step: int, failures: list[str]) -> None:
    """Records in the checkpoint folder ``folder`` that its run's end is done, at ``step``, and the end
    checks that failed (written to a temporary file renamed into place)."""
    path = Path(folder) / END_RECORD
    tmp = path.with_name(f".{END_RECORD}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"step": step, "failures": list(failures)}))
    os.replace(tmp, path)


def recorded_end(folder: Path, step: int) -> list[str] | None:
    """The end checks that failed in the run of checkpoint folder ``folder``, if its end at ``step`` is
    recorded (``record_end``); None when it is not (the run was stopped before its verdicts)."""
    try:
        record = json.loads((Path(folder) / END_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("step") != step:
        return None
    return [str(f) for f in record.get("failures", [])]


@dataclass
class Resume:
    path: Path
    version: int | None  # the TensorBoard/checkpoint version of the run it continues, when known
    global_step: int
    branch: bool = False  # a new version folder: the checkpoint's run has gone further
    done: bool = False  # nothing to train: the checkpoint is at or past trainer.max_steps, the run ended
    log_dir: Path | None = None  # the TensorBoard folder of the checkpoint's run, when known
    failures: list[str] | None = None  # with done: the end checks that failed in that run


def furthest_step(folder: Path) -> float:
    """The latest step any checkpoint in a run's checkpoint folder holds (-1 when it holds none; infinite
    when its ``last.ckpt`` or ``final.ckpt`` cannot be read, and so may hold any step)."""
    try:
        steps = checkpoint_steps(folder)
    except CheckpointError:
        return math.inf
    return steps[0][0] if steps else -1


#: The key of a checkpoint that holds ``run_identity``.
IDENTITY_KEY = "run_identity"
#: Lightning's other names of a precision.
PRECISION_NAMES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def run_identity(cfg: DictConfig) -> dict:
    """The settings that change the numbers a run produces besides the network's, the norm path's and the
    data's (the module's and the data's hyper-parameters, checked by ``checked``): the precision, compile,
    deterministic algorithms, the kind of device (``trainer.accelerator``, ``auto`` as it resolves here) and
    the number of processes (``trainer.devices`` x ``trainer.num_nodes``, which sets the global batch).
    A resume must have the same ones; docs/training.md lists every setting and which kind it is."""
    accelerator = str(cfg.trainer.accelerator)
    if accelerator == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    else:
        device = {"gpu": "cuda"}.get(accelerator, accelerator)
    devices = cfg.trainer.devices
    plain = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    precision = str(cfg.trainer.precision)
    return {
        "trainer.precision": PRECISION_NAMES.get(precision, precision),
        "compile": bool(cfg.compile),
        "trainer.deterministic": bool(cfg.trainer.deterministic),
        "trainer.accelerator": device,
        "processes": count_devices(plain, accelerator) * cfg.trainer.num_nodes,
    }


class RecordIdentity(L.Callback):
    """Writes ``run_identity`` into every checkpoint of the run (under ``IDENTITY_KEY``)."""

    def __init__(self, identity: dict) -> None:
        self.identity = identity

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[IDENTITY_KEY] = dict(self.identity)


def checked(path: Path, module: RMSNormRegressor, data: SplitData, identity: dict | None = None) -> dict:
    """The checkpoint at ``path``, if it holds this configuration's network, norm path and data, and was
    trained with the settings ``identity`` (``run_identity``) when given."""
    ckpt = read_checkpoint(path)
    # the kind of network first: its other keys differ anyway, and would name a size instead of the network
    check_matches(path, ckpt, {"kind": module.hparams.kind}, NETWORK_DEFAULTS)
    check_matches(path, ckpt, dict(module.hparams), NETWORK_DEFAULTS)
    data_hp = ckpt.get("datamodule_hyper_parameters")
    if data_hp is not None:
        check_matches(path, {"hyper_parameters": data_hp}, dict(data.hparams))
    if identity is not None:
        recorded = ckpt.get(IDENTITY_KEY)
        if not isinstance(recorded, dict):
            raise CheckpointError(
                f"checkpoint {path} records none of the settings {', '.join(identity)}, so a resume cannot tell "
                "whether it would continue the same numbers; accepted: a checkpoint that records them"
            )
        missing = [key for key in identity if key not in recorded]
        if missing:
            raise CheckpointError(f"checkpoint {path} does not record {', '.join(missing)}")
        check_matches(path, {"hyper_parameters": recorded}, identity)
    return ckpt


def version_folders(run_dir: Path) -> list[Path]:
    """The version folders of a run that hold a checkpoint, the most recently written first."""

    def newest_write(folder: Path) -> float:
        return max((p.stat().st_mtime for p in folder.glob("*.ckpt")), default=-math.inf)

    folders = [p for p in run_dir.glob("version_*") if re.fullmatch(r"version_\d+", p.name) and p.is_dir()]
    folders = [p for p in folders if newest_write(p) > -math.inf]
    return sorted(folders, key=lambda p: (newest_write(p), int(p.name.removeprefix("version_"))), reverse=True)


def furthest_checkpoint(folder: Path) -> Path:
    """The checkpoint of ``folder`` at the furthest step. Raises ``CheckpointError`` when that file (or a
    ``last.ckpt`` or ``final.ckpt``, whose step only its content tells) is damaged."""
    try:
        steps = checkpoint_steps(folder)
    except CheckpointError as e:
        raise CheckpointError(f"ckpt_path=last: the newest run's {e}; {PASS_ANOTHER}") from None
    path = steps[0][1]
    try:
        read_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(f"ckpt_path=last: the furthest {e}; {PASS_ANOTHER}") from None
    return path


PASS_ANOTHER = "pass ckpt_path=<file> to resume from another checkpoint"


def find_last(
    run_dir: Path, module: RMSNormRegressor, data: SplitData, identity: dict | None = None
) -> tuple[Path, dict]:
    """``ckpt_path=last``: the furthest checkpoint of the newest run (version folder) of this configuration
    (a run name leaves out values that only change the training: a version of another such value is
    passed over). A damaged furthest checkpoint is an error, never a step back to an earlier one."""
    folders = version_folders(run_dir)
    if not folders:
        raise CheckpointError(f"ckpt_path=last: {run_dir} holds no checkpoint to resume from")
    refusals = []
    for folder in folders:
        path = furthest_checkpoint(folder)
        try:
            return path, checked(path, module, data, identity)
        except CheckpointError as e:  # a whole file of another configuration
            refusals.append(e)
    raise refusals[0]  # none matches: the newest one says why


def resolve_resume(cfg: DictConfig, module: RMSNormRegressor, data: SplitData) -> Resume | None:
    """Finds and checks the checkpoint ``cfg.ckpt_path`` names, before anything is written (``find_last``
    for ``last``). The file must load with ``weights_only=True``, hold this configuration's network,
    norm path and data, and have been trained with the same ``run_identity``."""
    if cfg.ckpt_path is None:
        return None
    run_dir = project_path(cfg.paths.checkpoints) / run_name(cfg)
    identity = run_identity(cfg)
    if cfg.ckpt_path == "last":
        path, ckpt = find_last(run_dir, module, data, identity)
    else:
        path = project_path(cfg.ckpt_path)
        ckpt = checked(path, module, data, identity)
    step = int(ckpt["global_step"])
    version = None
    if path.parent.parent == run_dir and re.fullmatch(r"version_\d+", path.parent.name):
        version = int(path.parent.name.removeprefix("version_"))
    further = version is not None and furthest_step(path.parent) > step
    log_dir = project_path(cfg.paths.runs) / run_name(cfg) / f"version_{version}" if version is not None else None
    ended = further or (path.parent / "final.ckpt").exists()
    end = recorded_end(path.parent, step) if version is not None else None
    if step > cfg.trainer.max_steps or (step == cfg.trainer.max_steps and (further or end is not None)):
        return Resume(path=path, version=version, global_step=step, done=True, log_dir=log_dir, failures=end)
    if step == cfg.trainer.max_steps and version is not None:  # stopped before its verdicts: finish its end
        return Resume(path=path, version=version, global_step=step, log_dir=log_dir)
    if ended or version is None:  # a file of no run of this configuration also starts a new folder
        return Resume(path=path, version=None, global_step=step, branch=True, log_dir=log_dir)
    return Resume(path=path, version=version, global_step=step, log_dir=log_dir)


def mark_restart(logger: TensorBoardLogger, step: int) -> None:
    """Tells TensorBoard that the run restarts at ``step``: values logged at later steps before the
    interruption are orphans and are dropped by its readers, so each step keeps one value."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    with run_event_writer(logger) as writer:
        writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))


def mark_branch(logger: TensorBoardLogger, checkpoint: Path, step: int) -> None:
    """Records in a branch's TensorBoard folder the checkpoint it started from: a text event
    ``resume/branched_from`` at that step (TensorBoard's TEXT tab)."""
    from torch.utils.tensorboard.summary import text

    with run_event_writer(logger) as writer:
        writer.add_summary(text("resume/branched_from", f"{checkpoint} at step {step}"), step)
