"""Typed schemas of the Hydra configuration in ``conf/`` and the checks OmegaConf's types cannot express.

The schema holds types only; the values, the default schedule among them, live once, in the YAML files.
It is registered in Hydra's ConfigStore as ``base_config``; ``conf/config.yaml`` lists it first
in its defaults, so every value from a YAML file or the command line is checked against these types
when Hydra composes the configuration (a string for ``trainer.max_steps`` fails there, naming the key).
Ranges (a negative step count, a zero batch size, a NaN, a seed numpy refuses, an eps float32 cannot
hold, splits too small for the processes, a path longer than the file system allows, a network whose
training state does not fit in memory) are checked by
``validate`` before any work starts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ..ops.impls import FALLBACKS, IMPLS
from .paths import project_path


@dataclass
class NormConfig:
    impl: str = MISSING
    eps: float = MISSING
    fallback: str | None = None


@dataclass
class ModelConfig:
    """``kind: mlp`` (``conf/model/default.yaml``) sets the first three sizes, ``kind: transformer``
    (``conf/model/transformer.yaml``) the decoder's; the other kind's keys stay null."""

    kind: str = MISSING
    lr: float = MISSING
    input_dim: int | None = None
    hidden_dim: int | None = None
    output_dim: int | None = None
    dim: int | None = None
    layers: int | None = None
    heads: int | None = None
    mlp_hidden: int | None = None
    seq_len: int | None = None
    qk_norm: bool | None = None


@dataclass
class DataConfig:
    batch_size: int = MISSING
    train_size: int = MISSING
    val_size: int = MISSING
    test_size: int = MISSING
    noise: float | None = None  # the regression's (model.kind mlp); null for text
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
class NameDefaults:
    """The default network, data and norm values, composed from ``conf/`` untouched by overrides: a run's
    name (``paths.run_name``) lists the values that differ from them. Not a setting."""

    norm: NormConfig = field(default_factory=NormConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)


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
    name_defaults: NameDefaults = field(default_factory=NameDefaults)


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
    # ${pid:} in conf/config.yaml: Hydra's output folders are unique per invocation
    if not OmegaConf.has_resolver("pid"):
        OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)


register_configs()

#: The networks ``model.kind`` names (``network.build_network``), with the ``model`` keys each needs; the
#: keys of the other kind must stay null.
MODEL_KINDS = {
    "mlp": ("input_dim", "hidden_dim", "output_dim"),
    "transformer": ("dim", "layers", "heads", "mlp_hidden", "seq_len", "qk_norm"),
}
#: Lightning's precisions this run accepts; with bf16-true the whole network holds and computes bfloat16.
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true")
#: Lightning's accelerators this run can use.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
#: Lightning's strategies this run supports: one process, or data parallelism (the data are sharded for DDP).
STRATEGIES = (
    "auto",
    "single_device",
    "fsdp2",  # FSDP2 through Lightning's ModelParallelStrategy: training/trainer.py lightning_strategy
    "ddp",
    "ddp_spawn",
    "ddp_fork",
    "ddp_notebook",
    "ddp_find_unused_parameters_false",
    "ddp_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_false",
    "ddp_spawn_find_unused_parameters_true",
    "ddp_fork_find_unused_parameters_false",
    "ddp_fork_find_unused_parameters_true",
    "ddp_notebook_find_unused_parameters_false",
    "ddp_notebook_find_unused_parameters_true",
)
#: The seeds ``lightning.seed_everything`` (numpy) accepts; data.seed shares the range.
SEED_MAX = 2**32 - 1
#: float32, the dtype of the weights and of the RMSNorm arithmetic under every precision (half formats
#: are computed in float32): its smallest normal and its largest finite number.
FLOAT32_TINY = 2.0**-126
FLOAT32_MAX = (2 - 2.0**-23) * 2.0**127
#: Bytes below a configured output folder that a run adds: ``<run name>/version_<n>/<file>``.
RUN_TAIL_BYTES = 255
#: Copies of the parameters that training holds: the weights, their gradients and Adam's two moments.
TRAINING_STATE_COPIES = 4
#: When the file system does not say (``os.pathconf``): the common limits.
NAME_MAX, PATH_MAX = 255, 4096


class ConfigError(ValueError):
    """A configuration value that has the right type but is outside what the run accepts."""


def count_devices(devices: Any, accelerator: str) -> int | None:
    """The processes per machine that ``trainer.devices`` asks for; ``None`` for a value Lightning refuses.

    ``auto`` and ``-1`` mean every GPU when the run goes to GPUs (``torch.cuda.device_count()``), one
    process on the CPU; a list, or a string of comma-separated indices, names GPUs.
    """
    import torch

    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            devices = -1
        elif re.fullmatch(r"-?\d+", text):
            devices = int(text)
        elif on_gpu and re.fullmatch(r"\d+(\s*,\s*\d+)*\s*,?", text):
            devices = [int(i) for i in text.split(",") if i.strip()]
        else:
            return None
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        if devices == -1:
            return max(torch.cuda.device_count(), 1) if on_gpu else 1
        return devices if devices >= 1 else None
    if on_gpu and isinstance(devices, Sequence) and devices:
        indices = list(devices)
        if all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
            if len(set(indices)) == len(indices):
                return len(indices)
    return None


def check_processes(cfg: DictConfig, processes: int) -> None:
    """Refuse splits that do not give each of ``processes`` processes at least one row (a process with
    none stops the others in their first collective) and a global batch larger than the training split."""
    if processes > 1:
        for key in ("data.val_size", "data.test_size"):
            value = OmegaConf.select(cfg, key)
            if value < processes:
                raise ConfigError(
                    f"{key} is {value}, fewer rows than the {processes} processes (trainer.devices "
                    f"{processes // cfg.trainer.num_nodes} x trainer.num_nodes {cfg.trainer.num_nodes}); "
                    f"accepted: an integer >= {processes}"
                )
    global_batch = cfg.data.batch_size * processes
    if global_batch > cfg.data.train_size:
        across = f" x {processes} processes = {global_batch}" if processes > 1 else ""
        raise ConfigError(
            f"data.batch_size is {cfg.data.batch_size}{across}, larger than data.train_size "
            f"{cfg.data.train_size}; accepted: a batch size <= {cfg.data.train_size // processes} "
            "(the training split over the processes)"
        )


def check_path(key: str, path: Path) -> None:
    """Refuse an output folder whose path, or one of its names, is longer than its file system allows,
    leaving room for the run's own folders and files below it."""
    existing = path
    while not os.path.exists(existing) and existing != existing.parent:  # False also for a name too long
        existing = existing.parent

    def limit(name: str, default: int) -> int:
        try:
            return os.pathconf(existing, name)
        except (OSError, ValueError):
            return default

    name_max, path_max = limit("PC_NAME_MAX", NAME_MAX), limit("PC_PATH_MAX", PATH_MAX)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise ConfigError(
                f"{key} has a folder name of {size} bytes ({part[:24]}...); accepted: names of at most "
                f"{name_max} bytes (the file system's limit)"
            )
    size, most = len(os.fsencode(str(path))), path_max - RUN_TAIL_BYTES
    if size > most:
        raise ConfigError(
            f"{key} is a path of {size} bytes ({str(path)[:32]}...); accepted: at most {most} bytes "
            f"(the file system's {path_max} less {RUN_TAIL_BYTES} for the run's folders and files)"
        )


def check_float32(key: str, value: float, lowest: str) -> None:
    """A finite number that float32 holds without turning it into 0 or inf (``lowest``: ``> 0`` or ``>= 0``)."""
    if lowest == ">= 0" and value == 0:
        return
    if not (math.isfinite(value) and FLOAT32_TINY <= value <= FLOAT32_MAX):
        raise ConfigError(
            f"{key} is {value}; accepted: a finite number {lowest} that float32 holds "
            f"({'0 or ' if lowest == '>= 0' else ''}{FLOAT32_TINY:.8g} to {FLOAT32_MAX:.8g})"
        )


def check_model(cfg: DictConfig) -> dict[str, int]:
    """Refuse a ``model.kind`` not in ``MODEL_KINDS``, a key its network needs left null, a key of the other
    kind set, and a transformer whose heads do not split ``dim`` into heads of an even size. Returns the
    integer sizes of the chosen kind, which must be positive."""
    kind = cfg.model.kind
    if kind not in MODEL_KINDS:
        raise ConfigError(f"model.kind is {kind!r}; accepted: {', '.join(MODEL_KINDS)}")
    for other, keys in MODEL_KINDS.items():
        for key in keys:
            value = cfg.model[key]
            if other == kind and value is None:
                raise ConfigError(f"model.{key} is null; accepted: a value, which model.kind {kind} needs")
            if other != kind and value is not None:
                raise ConfigError(
                    f"model.{key} is {value}, a setting of model.kind {other}; accepted: null with model.kind {kind}"
                )
    noise = cfg.data.noise
    if (kind == "mlp") != (noise is not None):
        accepted = "a number >= 0 with model.kind mlp" if kind == "mlp" else f"null with model.kind {kind}"
        raise ConfigError(f"data.noise is {noise}; accepted: {accepted}")
    sizes = {f"model.{key}": cfg.model[key] for key in MODEL_KINDS[kind] if key != "qk_norm"}
    if kind == "transformer":
        dim, heads = cfg.model.dim, cfg.model.heads
        if heads >= 1 and dim >= 1 and (dim % heads or (dim // heads) % 2):
            raise ConfigError(
                f"model.dim is {dim} with model.heads {heads}; accepted: a dim that the heads split into "
                "heads of an even size (rotary embeddings rotate pairs)"
            )
    return sizes


def memory_bytes(on_gpu: bool) -> int:
    """The memory a process trains in: a GPU's (the first one's), or the machine's physical memory."""
    import torch

    if on_gpu:
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(cfg: DictConfig, processes: int) -> None:
    """Refuse model sizes whose training state (``TRAINING_STATE_COPIES`` copies of the parameters, in their
    dtype; under fsdp2 shared by the processes) does not fit in the memory a process trains in: a lower
    bound of what training needs (activations come on top), so that what it refuses can never run. The
    parameters are counted on a network built on the meta device, which allocates nothing."""
    import torch

    from .network import build_network

    sizes = {key: cfg.model[key] for key in MODEL_KINDS[cfg.model.kind]}
    bf16 = str(cfg.trainer.precision) == "bf16-true"
    with torch.device("meta"):
        net = build_network(
            **{"input_dim": None, "hidden_dim": None, "output_dim": None, **sizes},
            norm_impl=cfg.norm.impl,
            eps=cfg.norm.eps,
            kind=cfg.model.kind,
            dtype="bfloat16" if bf16 else "float32",
        )
    parameters = sum(p.numel() for p in net.parameters())
    parameter_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    shards = processes if cfg.trainer.strategy == "fsdp2" else 1
    need = TRAINING_STATE_COPIES * parameter_bytes // shards
    accelerator = cfg.trainer.accelerator
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    have = memory_bytes(on_gpu)
    if need > have:
        listed = ", ".join(f"{key} {value}" for key, value in sizes.items() if key != "qk_norm")
        raise ConfigError(
            f"model sizes {listed} make a network of {parameters:,} parameters, whose training state (weights, "
            f"gradients and Adam's two moments) takes {need / 2**30:,.1f} GiB a process; accepted: sizes whose "
            f"training state fits in the {'GPU' if on_gpu else 'machine'}'s {have / 2**30:,.1f} GiB"
        )


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
        **check_model(cfg),
        "checkpoint.every_n_steps": cfg.checkpoint.every_n_steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} is {value}; accepted: an integer >= 1")
    for key, value in {"seed": cfg.seed, "data.seed": cfg.data.seed}.items():
        if not 0 <= value <= SEED_MAX:
            raise ConfigError(f"{key} is {value}; accepted: an integer from 0 to {SEED_MAX} (2**32 - 1)")
    for key, value in {"model.lr": cfg.model.lr, "norm.eps": cfg.norm.eps}.items():
        check_float32(key, value, "> 0")
    if cfg.data.noise is not None:
        check_float32("data.noise", cfg.data.noise, ">= 0")
    if cfg.parity.every_n_steps < 0:
        raise ConfigError(
            f"parity.every_n_steps is {cfg.parity.every_n_steps}; accepted: an integer >= 0 (0: only the initial check)"
        )
    if cfg.norm.fallback not in FALLBACKS:
        raise ConfigError(f"norm.fallback is {cfg.norm.fallback!r}; accepted: null or reference")
    if cfg.norm.impl not in IMPLS:
        raise ConfigError(f"norm.impl is {cfg.norm.impl!r}; accepted: {', '.join(IMPLS)}")
    if str(cfg.trainer.precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision is {cfg.trainer.precision!r}; accepted: {', '.join(PRECISIONS)}")
    if cfg.trainer.accelerator not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator is {cfg.trainer.accelerator!r}; accepted: {', '.join(ACCELERATORS)}")
    if cfg.trainer.strategy not in STRATEGIES:
        raise ConfigError(
            f"trainer.strategy is {cfg.trainer.strategy!r}; accepted: auto, single_device, fsdp2 or a ddp strategy "
            "(ddp, ddp_spawn, ddp_fork, ddp_notebook, each with _find_unused_parameters_true/false)"
        )
    devices = cfg.trainer.devices
    plain = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    per_node = count_devices(plain, cfg.trainer.accelerator)
    if per_node is None:
        raise ConfigError(
            f"trainer.devices is {plain!r}; accepted: an integer >= 1, -1 or auto, or on GPUs a list of "
            "distinct GPU indices"
        )
    processes = per_node * cfg.trainer.num_nodes
    if cfg.trainer.strategy == "single_device" and processes > 1:
        raise ConfigError(
            f"trainer.strategy is 'single_device' with {processes} processes (trainer.devices x "
            "trainer.num_nodes); accepted: 1 process, or a ddp strategy"
        )
    if cfg.trainer.strategy == "fsdp2" and cfg.compile:
        # Dynamo stops at FSDP2's hooks inside the network, and the network is compiled whole (fullgraph)
        raise ConfigError(
            "compile is true with trainer.strategy fsdp2; accepted: compile=false under fsdp2, or compile=true "
            "with a ddp strategy"
        )
    check_processes(cfg, processes)
    check_memory(cfg, processes)
    for key in ("runs", "checkpoints"):
        check_path(f"paths.{key}", project_path(cfg.paths[key]))
