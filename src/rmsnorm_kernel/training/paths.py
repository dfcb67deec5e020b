"""Where a run's files go: configured paths are relative to the folder the command was started in."""

from __future__ import annotations

import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def project_path(path: str) -> Path:
    """A configured path, relative to where the command was started (Hydra may change the working folder)."""
    base = Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()
    return (base / path).resolve()


#: The values that make another network or other data, and the name each takes in a run's name.
NAME_KEYS = {
    "model.kind": "",
    "model.input_dim": "in",
    "model.hidden_dim": "hidden",
    "model.output_dim": "out",
    "model.dim": "dim",
    "model.layers": "layers",
    "model.heads": "heads",
    "model.mlp_hidden": "mlp",
    "model.seq_len": "seq",
    "model.qk_norm": "qknorm",
    "norm.eps": "eps",
    "norm.fallback": "fallback-",
    "data.seed": "dataseed",
    "data.noise": "noise",
}
#: Where the composed configuration holds the defaults a run's name is relative to: ``conf/config.yaml``
#: composes the default network and data groups (and the chosen norm path's group) there a second time,
#: untouched by overrides, so the name depends on the configuration alone, never on where the package is.
NAME_DEFAULTS = "name_defaults"


def run_name(cfg: DictConfig) -> str:
    """The name of a run's TensorBoard and checkpoint folders: its norm path and seed, then each value of
    ``NAME_KEYS`` that differs from its default in the composed configuration (``cfg.name_defaults``,
    ``triton_seed0_hidden128``) and is set (the keys of the other ``model.kind`` are null): two runs of
    different networks or data never share a folder.

    A configuration composed without those defaults names every value of ``NAME_KEYS``: longer, but still
    distinct for every network and data."""
    from omegaconf import OmegaConf

    name = f"{cfg.norm.impl}_seed{cfg.seed}"
    defaults = OmegaConf.select(cfg, NAME_DEFAULTS)
    for key, short in NAME_KEYS.items():
        value = OmegaConf.select(cfg, key)
        if value is not None and (defaults is None or value != OmegaConf.select(defaults, key)):
            name += f"_{short}{value}"
    return name


#: The name of the file written into each output folder and removed at once, to prove it writable.
PROBE_PREFIX = ".write-probe."


class PathError(ValueError):
    """An output folder that cannot be created or written, with a message naming it."""


def prepare_folder(key: str, folder: Path) -> list[Path]:
    """Creates ``folder`` (configured as ``key``) and writes and removes a file in it.

    Returns the folders it created, outermost first. Raises ``PathError`` naming the path when the
    folder cannot be created (a regular file in the way, no permission) or written, after removing
    whatever it created.
    """
    missing = []
    p = folder
    while not p.exists() and not p.is_symlink():
        missing.append(p)
        p = p.parent
    missing.reverse()
    if not p.is_dir():
        raise PathError(f"{key}: cannot create {folder}: {p} is a regular file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f"{PROBE_PREFIX}{os.getpid()}"
        try:
            with open(probe, "xb") as f:
                f.write(b"probe")
        finally:
            if probe.exists():
                probe.unlink()
    except OSError as e:
        remove_folders(missing)
        raise PathError(f"{key}: cannot write to {folder}: {e.strerror or e}") from None
    return missing


def remove_folders(created: list[Path]) -> None:
    """Removes folders ``prepare_folder`` created, innermost first, each only if it is still empty."""
    for p in reversed(created):
        try:
            p.rmdir()
        except OSError:
            pass


def claim_version(runs_dir: Path, checkpoints_dir: Path) -> int:
    """The next version number free in a run's TensorBoard and checkpoint folders, claimed by creating its
    checkpoint folder (``mkdir`` fails for all but one creator), so two runs started at once never share
    a version."""

    def next_version(folder: Path) -> int:
        numbers = [
            int(p.name[len("version_") :]) for p in folder.glob("version_*") if p.name[len("version_") :].isdigit()
        ]
        return max(numbers, default=-1) + 1

    version = max(next_version(runs_dir), next_version(checkpoints_dir))
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            (checkpoints_dir / f"version_{version}").mkdir()
            return version
        except FileExistsError:
            version += 1
