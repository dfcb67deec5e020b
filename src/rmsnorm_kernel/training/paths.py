"""Where a run's files go: configured paths are relative to the folder the command was started in."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def project_path(path: str) -> Path:
    """A configured path, relative to where the command was started (Hydra may change the working folder)."""
    base = Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()
    return (base / path).resolve()


def run_name(cfg: DictConfig) -> str:
    """The name of a run's TensorBoard and checkpoint folders: its norm path and seed."""
    return f"{cfg.norm.impl}_seed{cfg.seed}"
