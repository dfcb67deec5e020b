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
    "model.input_dim": "in",
    "model.hidden_dim": "hidden",
    "model.output_dim": "out",
    "norm.eps": "eps",
    "norm.fallback": "fallback-",
    "data.seed": "dataseed",
    "data.noise": "noise",
}
#: The configuration folder of train.py, whose group defaults the names are relative to.
CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def default_values() -> dict:
    """The values of ``NAME_KEYS`` in ``conf/`` (the norm group's for each path), read from its YAML files."""
    from omegaconf import OmegaConf

    values = {}
    for group in ("model", "data"):
        node = OmegaConf.load(CONF_DIR / group / "default.yaml")
        values.update({f"{group}.{k}": v for k, v in node.items()})
    for impl_file in sorted((CONF_DIR / "norm").glob("*.yaml")):
        node = OmegaConf.load(impl_file)
        values[f"norm.{impl_file.stem}"] = {f"norm.{k}": v for k, v in node.items()}
    return values


def run_name(cfg: DictConfig) -> str:
    """The name of a run's TensorBoard and checkpoint folders: its norm path and seed, then each value of
    ``NAME_KEYS`` that differs from ``conf/`` (``triton_seed0_hidden128``): two runs of different
    networks or data never share a folder."""
    from omegaconf import OmegaConf

    name = f"{cfg.norm.impl}_seed{cfg.seed}"
    if not CONF_DIR.is_dir():
        return name
    defaults = default_values()
    defaults.update(defaults.get(f"norm.{cfg.norm.impl}", {}))
    for key, short in NAME_KEYS.items():
        value = OmegaConf.select(cfg, key)
        if key in defaults and value != defaults[key]:
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
