"""How a run that stops after set-up is reported: the write a full disk refused (``OutputError``), and the
last good checkpoint its one line names (``last_good_line``)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import traceback
from pathlib import Path

from ..files import WRITE_ERRNOS
from .checkpoints import last_good_checkpoint


class OutputError(RuntimeError):
    """A file of the run could not be written (a full disk, an I/O error): the message names the cause,
    the file or folder, and the last good checkpoint."""


def write_failure(error: BaseException) -> OSError | None:
    """The refused write behind ``error``, if any: an ``OSError`` of ``WRITE_ERRNOS`` in its chain of
    causes (Lightning reports a failed TensorBoard write as a ValueError about the logged value)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in WRITE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def describe_write_failure(error: OSError, log_dir: str) -> str:
    """``disk full: No space left on device, writing <file>`` (the TensorBoard folder for its event files,
    whose writer thread does not name them)."""
    cause = "disk full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "write failed"
    if error.filename:
        where = str(error.filename)
    elif any(f"{os.sep}tensorboard{os.sep}" in frame.filename for frame in traceback.extract_tb(error.__traceback__)):
        where = f"the TensorBoard event files in {log_dir}"
    else:
        where = "a file of the run"
    return f"{cause}: {os.strerror(error.errno)}, writing {where}"


def last_good_line(folder: Path, resumed_from: Path | None) -> str:
    """The end of each line that reports a run stopped after set-up: its last good checkpoint."""
    kept = last_good_checkpoint(folder, resumed_from)
    if kept is None:
        return "no checkpoint had been written yet"
    if resumed_from is not None and kept == Path(resumed_from) and kept.parent != folder:
        return f"the last good checkpoint is {kept} (the one this run resumed from)"
    return f"the last good checkpoint is {kept}"


@contextlib.contextmanager
def writer_thread_errors_quiet():
    """TensorBoard writes its event files from a thread: a write the disk refuses is raised again at the
    next write of the training process, which reports it in one line; the thread's own traceback is not
    printed."""
    previous = threading.excepthook

    def hook(args) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous
