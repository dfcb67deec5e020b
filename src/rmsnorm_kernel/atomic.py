"""Writing a file whole or not at all: the one atomic write of the project's files (checkpoints, reports,
results, pages).

The bytes go to a temporary file in the destination's folder (``temporary_path``), are flushed to the
disk, and the temporary is renamed over the destination; then the folder's entry is flushed too. A
rename within one file system is atomic, so at every instant the destination holds either the previous
complete file or the new one: a reader, or a run stopped half way, never meets half a file. A write
that fails (a full disk, a folder where the file goes) leaves no temporary behind and the destination
as it was, and raises the ``OSError`` of the write.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """Where ``write_atomic`` stages ``path``: ``.<name>.<pid>.tmp`` beside it (hidden, one per process)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview | str) -> Path:
    """``data`` (text is written as UTF-8) at ``path``, written whole or not at all (see the module
    docstring); the missing folders of ``path`` are made. Returns ``path``."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    # The rename itself must reach the disk too: sync the folder's entry.
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path
