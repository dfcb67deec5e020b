"""The Lightning Trainer's arguments from a run's typed configuration (``config.py``): the one place that
maps configuration keys to ``lightning.Trainer`` (``trainer_kwargs``), with the strategy Lightning takes
for ``trainer.strategy`` and the precisions it would run as another."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from omegaconf import DictConfig, OmegaConf

from .checkpoints import AtomicCheckpointIO
from .config import ConfigError, count_devices


def trainer_kwargs(cfg: DictConfig) -> dict:
    """``lightning.Trainer``'s arguments from ``cfg``, but for what a run builds itself (the logger, the
    callbacks, the folder): the ``trainer.*`` keys as Lightning takes them, and the settings every run has."""
    return dict(
        max_steps=cfg.trainer.max_steps,
        val_check_interval=cfg.trainer.val_check_interval,
        check_val_every_n_epoch=None,  # val_check_interval counts steps across epochs
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=lightning_strategy(cfg),
        precision=cfg.trainer.precision,
        deterministic=cfg.trainer.deterministic,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        enable_model_summary=False,
        log_every_n_steps=cfg.trainer.log_every_n_steps,  # the step timer's window
        plugins=[AtomicCheckpointIO()],  # every checkpoint written whole or not at all
        use_distributed_sampler=False,  # evaluation splits are sharded without padding (data.py)
    )


def lightning_strategy(cfg: DictConfig) -> str | ModelParallelStrategy:
    """``trainer.strategy`` as Lightning takes it. ``fsdp2`` is FSDP2: Lightning's ``ModelParallelStrategy``
    with every process a data-parallel shard (the module's ``configure_model`` shards the network with
    ``fully_shard``), its checkpoints gathered whole into one file by process 0, the file every check and
    resume reads, as under DDP."""
    if cfg.trainer.strategy != "fsdp2":
        return cfg.trainer.strategy
    devices = cfg.trainer.devices
    plain = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    processes = count_devices(plain, cfg.trainer.accelerator) * cfg.trainer.num_nodes
    return ModelParallelStrategy(
        data_parallel_size=processes, tensor_parallel_size=1, save_distributed_checkpoint=False
    )


def check_precision(cfg: DictConfig) -> None:
    """Refuse a precision that Lightning would replace by another on this machine: the configuration and
    HPARAMS must record what runs. On the CPU, Lightning runs ``16-mixed`` as ``bf16-mixed``."""
    accelerator = str(cfg.trainer.accelerator)
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and str(cfg.trainer.precision) == "16-mixed":
        raise ConfigError(
            "trainer.precision is '16-mixed', which Lightning runs as bf16-mixed on the CPU; "
            "accepted on the CPU: 32-true, 32, bf16-mixed"
        )
