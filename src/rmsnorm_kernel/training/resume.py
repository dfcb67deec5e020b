"""Resuming a run: the checkpoint ``ckpt_path`` names, checked before anything is written, and the
TensorBoard marker that keeps one value per step across the interruption.

A resume never rewrites a run's history:

- a checkpoint already at or past ``trainer.max_steps`` leaves nothing to train (``Resume.done``), unless
  it is the last step's checkpoint of a run that stopped before its end (no ``final.ckpt`` beside it):
  then the run's end (the test, ``final.ckpt``) is done;
- a checkpoint of a run that has gone further (a later checkpoint in its folder) starts a new version
  folder, a branch (``Resume.branch``), which records where it came from; the run it came from keeps
  its checkpoints and its TensorBoard history;
- otherwise the run continues in its own folders, from the step of the checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig

from .checkpoints import CheckpointError, check_matches, read_checkpoint
from .data import SyntheticRegressionData
from .events import run_event_writer
from .model import RMSNormRegressor
from .paths import project_path, run_name


@dataclass
class Resume:
    path: Path
    version: int | None  # the TensorBoard/checkpoint version of the run it continues, when known
    global_step: int
    branch: bool = False  # a new version folder: the checkpoint's run has gone further
    done: bool = False  # nothing to train: the checkpoint is at or past trainer.max_steps, the run ended
    log_dir: Path | None = None  # the TensorBoard folder of the checkpoint's run, when known


STEP_FILE = re.compile(r"step(\d+)(?:-v\d+)?\.ckpt")


def furthest_step(folder: Path) -> int:
    """The latest step any checkpoint in a run's checkpoint folder holds (-1 when it holds none)."""
    steps = [int(m.group(1)) for p in folder.glob("*.ckpt") if (m := STEP_FILE.fullmatch(p.name))]
    for name in ("last.ckpt", "final.ckpt"):
        try:
            steps.append(int(read_checkpoint(folder / name, required=("global_step",))["global_step"]))
        except CheckpointError:
            pass  # absent or unreadable: it records no step
    return max(steps, default=-1)


def checked(path: Path, module: RMSNormRegressor, data: SyntheticRegressionData) -> dict:
    """The checkpoint at ``path``, if it holds this configuration's network, norm path and data."""
    ckpt = read_checkpoint(path)
    check_matches(path, ckpt, dict(module.hparams))
    data_hp = ckpt.get("datamodule_hyper_parameters")
    if data_hp is not None:
        check_matches(path, {"hyper_parameters": data_hp}, dict(data.hparams))
    return ckpt


def resolve_resume(cfg: DictConfig, module: RMSNormRegressor, data: SyntheticRegressionData) -> Resume | None:
    """Finds and checks the checkpoint ``cfg.ckpt_path`` names, before anything is written.

    ``last`` is the newest ``last.ckpt`` of this run (its folder: ``paths.run_name``) that holds this
    configuration. The file must load with
    ``weights_only=True`` and hold this configuration's network, norm path and data.
    """
    if cfg.ckpt_path is None:
        return None
    run_dir = project_path(cfg.paths.checkpoints) / run_name(cfg)
    if cfg.ckpt_path == "last":
        candidates = sorted(run_dir.glob("version_*/last.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
        if not candidates:
            raise CheckpointError(f"ckpt_path=last: {run_dir} holds no last.ckpt to resume from")
        # the newest of this configuration (a run name leaves out values that only change the training)
        for path in candidates:
            try:
                ckpt = checked(path, module, data)
                break
            except CheckpointError:
                continue
        else:
            ckpt = checked(candidates[0], module, data)  # none matches: the newest one says why
            path = candidates[0]
    else:
        path = project_path(cfg.ckpt_path)
        ckpt = checked(path, module, data)
    step = int(ckpt["global_step"])
    version = None
    if path.parent.parent == run_dir and re.fullmatch(r"version_\d+", path.parent.name):
        version = int(path.parent.name.removeprefix("version_"))
    further = version is not None and furthest_step(path.parent) > step
    log_dir = project_path(cfg.paths.runs) / run_name(cfg) / f"version_{version}" if version is not None else None
    ended = further or (path.parent / "final.ckpt").exists()
    if step > cfg.trainer.max_steps or (step == cfg.trainer.max_steps and ended):
        return Resume(path=path, version=version, global_step=step, done=True, log_dir=log_dir)
    if further or version is None:  # a file of no run of this configuration also starts a new folder
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
