"""Typed schemas of the Hydra configuration in ``conf/`` and the checks OmegaConf's types cannot express.

The schema holds types only; the values, the default schedule among them, live once, in the YAML files.
It is registered in Hydra's ConfigStore as ``base_config``; ``conf/config.yaml`` lists it first
in its defaults, so every value from a YAML file or the command line is checked against these types
when Hydra composes the configuration (a string for ``trainer.max_steps`` fails there, naming the key).
Ranges (a negative step count, a zero batch size) are checked by ``validate`` before any work starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ..ops.impls import FALLBACKS, IMPLS


@dataclass
class NormConfig:
    impl: str = MISSING
    eps: float = MISSING
    fallback: str | None = None


@dataclass
class ModelConfig:
    input_dim: int = MISSING
    hidden_dim: int = MISSING
    output_dim: int = MISSING
    lr: float = MISSING


@dataclass
class DataConfig:
    batch_size: int = MISSING
    train_size: int = MISSING
    val_size: int = MISSING
    test_size: int = MISSING
    noise: float = MISSING
    seed: int = MISSING


@dataclass
class TrainerConfig:
    max_steps: int = MISSING
    val_check_interval: int = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING
    num_nodes: int = MISSING
    log_every_n_steps: int = MISSING
    strategy: str = MISSING
    precision: str = MISSING
    enable_progress_bar: bool = MISSING
    deterministic: bool = MISSING


@dataclass
class ParityConfig:
    every_n_steps: int = MISSING


@dataclass
class CheckpointConfig:
    every_n_steps: int = MISSING


@dataclass
class PathsConfig:
    runs: str = MISSING
    checkpoints: str = MISSING


@dataclass
class Config:
    norm: NormConfig = field(default_factory=NormConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = MISSING
    compile: bool = MISSING
    ckpt_path: str | None = None


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
    # ${pid:} in conf/config.yaml: Hydra's output folders are unique per invocation
    if not OmegaConf.has_resolver("pid"):
        OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)


register_configs()

PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed")


class ConfigError(ValueError):
    """A configuration value that has the right type but is outside what the run accepts."""


def validate(cfg: DictConfig) -> None:
    """Refuse values the types allow but the run cannot use, naming the key, the value and what is accepted."""
    positive = {
        "trainer.max_steps": cfg.trainer.max_steps,
        "trainer.val_check_interval": cfg.trainer.val_check_interval,
        "trainer.num_nodes": cfg.trainer.num_nodes,
        "trainer.log_every_n_steps": cfg.trainer.log_every_n_steps,
        "data.batch_size": cfg.data.batch_size,
        "data.train_size": cfg.data.train_size,
        "data.val_size": cfg.data.val_size,
        "data.test_size": cfg.data.test_size,
        "model.input_dim": cfg.model.input_dim,
        "model.hidden_dim": cfg.model.hidden_dim,
        "model.output_dim": cfg.model.output_dim,
        "checkpoint.every_n_steps": cfg.checkpoint.every_n_steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} is {value}; accepted: an integer >= 1")
    if cfg.data.batch_size > cfg.data.train_size:
        raise ConfigError(
            f"data.batch_size is {cfg.data.batch_size}, larger than data.train_size {cfg.data.train_size}; "
            "accepted: a batch size <= the training split"
        )
    for key, value in {"model.lr": cfg.model.lr, "norm.eps": cfg.norm.eps}.items():
        if not value > 0:
            raise ConfigError(f"{key} is {value}; accepted: a number > 0")
    if cfg.parity.every_n_steps < 0:
        raise ConfigError(
            f"parity.every_n_steps is {cfg.parity.every_n_steps}; accepted: an integer >= 0 (0: only the initial check)"
        )
    if cfg.data.noise < 0:
        raise ConfigError(f"data.noise is {cfg.data.noise}; accepted: a number >= 0")
    if cfg.norm.fallback not in FALLBACKS:
        raise ConfigError(f"norm.fallback is {cfg.norm.fallback!r}; accepted: null or reference")
    if cfg.norm.impl not in IMPLS:
        raise ConfigError(f"norm.impl is {cfg.norm.impl!r}; accepted: {', '.join(IMPLS)}")
    if str(cfg.trainer.precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision is {cfg.trainer.precision!r}; accepted: {', '.join(PRECISIONS)}")
