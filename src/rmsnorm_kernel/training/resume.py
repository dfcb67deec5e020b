"""Resuming a run: the checkpoint ``ckpt_path`` names, checked before anything is written, and the
TensorBoard marker that keeps one value per step across the interruption."""

from __future__ import annotations

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


def resolve_resume(cfg: DictConfig, module: RMSNormRegressor, data: SyntheticRegressionData) -> Resume | None:
    """Finds and checks the checkpoint ``cfg.ckpt_path`` names, before anything is written.

    ``last`` is the newest ``last.ckpt`` of this run (same norm path and seed). The file must load with
    ``weights_only=True`` and hold this configuration's network, norm path and data.
    """
    if cfg.ckpt_path is None:
        return None
    run_dir = project_path(cfg.paths.checkpoints) / run_name(cfg)
    if cfg.ckpt_path == "last":
        candidates = sorted(run_dir.glob("version_*/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise CheckpointError(f"ckpt_path=last: {run_dir} holds no last.ckpt to resume from")
        path = candidates[-1]
    else:
        path = project_path(cfg.ckpt_path)
    ckpt = read_checkpoint(path)
    check_matches(path, ckpt, dict(module.hparams))
    data_hp = ckpt.get("datamodule_hyper_parameters")
    if data_hp is not None:
        check_matches(path, {"hyper_parameters": data_hp}, dict(data.hparams))
    version = None
    if path.parent.parent == run_dir and path.parent.name.startswith("version_"):
        version = int(path.parent.name.removeprefix("version_"))
    return Resume(path=path, version=version, global_step=int(ckpt["global_step"]))


def mark_restart(logger: TensorBoardLogger, step: int) -> None:
    """Tells TensorBoard that the run restarts at ``step``: values logged at later steps before the
    interruption are orphans and are dropped by its readers, so each step keeps one value."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    with run_event_writer(logger) as writer:
        writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
