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


def run_name(cfg: DictConfig) -> str:
    """The name of a run's TensorBoard and checkpoint folders: its norm path and seed."""
    return f"{cfg.norm.impl}_seed{cfg.seed}"


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
