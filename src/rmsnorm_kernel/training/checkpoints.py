"""Checkpoints that a crash cannot half-write, and a reader that names what is wrong with a bad file.

Writing: the checkpoint goes to a temporary file in the destination folder, is flushed to disk, and is
renamed over the destination. A rename within one file system is atomic, so at every instant the
destination holds either the previous complete file or the new complete file. (Lightning's own saver
stages the file in the system's temporary folder, which may be another file system, where the final
move is a copy.)

Reading: ``torch.load(..., weights_only=True)``, so a checkpoint file cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ..atomic import TMP_SUFFIX, write_atomic

REQUIRED_KEYS = ("state_dict", "hyper_parameters", "optimizer_states", "loops", "global_step")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with a message naming the file and the problem."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written (a full disk, an I/O error): the ``OSError`` of the write,
    with ``filename`` the checkpoint's path. The previous file at that path, if any, is left whole."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` through a temporary file renamed into place (see the module docstring).

    The checkpoint is serialised in memory first, so a write the disk refuses raises the ``OSError`` of
    that write (``CheckpointWriteError``, naming ``path``), not an error of the archive writer's.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    try:
        write_atomic(path, buffer.getbuffer())
    except OSError as e:
        raise CheckpointWriteError(e.errno, e.strerror or str(e), str(path)) from e


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files a killed writer left behind (never a checkpoint: those are renamed into place)."""
    stale = sorted(folder.glob(f".*{TMP_SUFFIX}")) if folder.is_dir() else []
    for p in stale:
        p.unlink()
    return stale


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with the write made atomic (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO: storage_options is {storage_options!r}; accepted: None")
        atomic_torch_save(checkpoint, path)


def read_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = REQUIRED_KEYS) -> dict:
    """Loads a checkpoint safely; raises ``CheckpointError`` naming the file and what is wrong with it.

    ``required`` are the keys it must hold: by default those a training run needs to resume.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes)")
    try:
        # torch.load does not verify the CRC-32 that torch.save stores for each record of the zip
        # archive: damaged tensor bytes would load as wrong weights. zipfile checks every record.
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
        if damaged is not None:
            raise CheckpointError(f"checkpoint {path} is corrupted (record {damaged} fails its CRC-32 check)")
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted and cannot be read ({reason})") from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(ckpt).__name__}, not a training checkpoint")
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is not a full training checkpoint of this project (missing: {', '.join(missing)})"
        )
    return ckpt


def check_matches(path: str | os.PathLike, ckpt: dict, expected: dict, defaults: dict | None = None) -> None:
    """The checkpoint's hyper-parameters must be those of the configured network; name the first mismatch.
    ``defaults``: the value of each hyper-parameter a checkpoint may lack."""
    hp = {**(defaults or {}), **ckpt["hyper_parameters"]}
    for key, want in expected.items():
        if key not in hp:
            raise CheckpointError(f"checkpoint {path} is not from this project's network (no hyper-parameter {key!r})")
        if hp[key] != want:
            what = {"norm_impl": "norm path", "kind": "model.kind"}.get(key, key)
            raise CheckpointError(
                f"checkpoint {path} was trained with {what} = {hp[key]!r}; the configuration asks for {want!r}"
            )


STEP_FILE = re.compile(r"step(\d+)(?:-v\d+)?\.ckpt")
#: Among checkpoints of one step, the one ``ckpt_path=last`` resumes: last.ckpt, then final.ckpt, then a step file.
PREFERENCE = {"last.ckpt": 0, "final.ckpt": 1}


def checkpoint_steps(folder: Path) -> list[tuple[int, Path]]:
    """Every checkpoint of a run's checkpoint folder with its step, furthest first.

    A step file's step is its name's; ``last.ckpt`` and ``final.ckpt`` are read (CRC-checked) for theirs.
    Raises ``CheckpointError`` naming a ``last.ckpt`` or ``final.ckpt`` that cannot be read: it may hold the
    furthest step, which nothing else tells.
    """
    found = []
    for p in folder.glob("*.ckpt") if folder.is_dir() else []:
        if m := STEP_FILE.fullmatch(p.name):
            found.append((int(m.group(1)), p))
        elif p.name in PREFERENCE:
            found.append((int(read_checkpoint(p, required=("global_step",))["global_step"]), p))
    return sorted(found, key=lambda sp: (-sp[0], PREFERENCE.get(sp[1].name, 2), sp[1].name))


def finite_state(ckpt: dict) -> bool:
    """Every tensor of the weights and of the optimizer's state is finite."""

    def tensors(node):
        if isinstance(node, torch.Tensor):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from tensors(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                yield from tensors(v)

    return all(
        bool(torch.isfinite(t).all())
        for t in tensors([ckpt["state_dict"], ckpt["optimizer_states"]])
        if t.is_floating_point()
    )


def last_good_checkpoint(folder: Path, resumed_from: Path | None = None) -> Path | None:
    """The furthest checkpoint of ``folder`` that reads back whole and holds finite weights and optimizer
    state; else ``resumed_from`` (the checkpoint the run started from), if it is such a file; else None."""
    try:
        candidates = [p for _, p in checkpoint_steps(folder)]
    except CheckpointError:  # an unreadable last.ckpt or final.ckpt: judge the step files alone
        candidates = sorted(
            (p for p in folder.glob("step*.ckpt") if STEP_FILE.fullmatch(p.name)),
            key=lambda p: -int(STEP_FILE.fullmatch(p.name).group(1)),
        )
    if resumed_from is not None:
        candidates.append(Path(resumed_from))
    for path in candidates:
        try:
            if finite_state(read_checkpoint(path)):
                return path
        except CheckpointError:
            continue
    return None


#: The lock file of a run's checkpoint folder, held by the process that writes the run.
LOCK_NAME = ".run.lock"


class RunInUse(RuntimeError):
    """Another live process holds the run's lock, with a message naming the folder and that process."""


class RunLock:
    """An exclusive ``fcntl.flock`` on ``<checkpoint folder>/.run.lock``, taken without waiting.

    The operating system releases the lock when the process ends, however it ends: a file left by a
    killed process holds no lock and blocks nobody. The file records the holder's process id for the
    message; the holder removes it on release, while still holding the lock.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunInUse(
                    f"{self.folder} is being written by process {holder} (it holds {self.path}); "
                    "a run is resumed by one process at a time"
                ) from None
            # The previous holder may have removed the file between our open and our lock: lock the file
            # that is in place, not an orphan.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self.fd)  # closing releases the lock
        self.fd = None
