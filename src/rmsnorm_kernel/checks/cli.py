"""The command-line layer that the check commands and ``python -m benchmarks.*`` share: their exit
statuses, a parser whose usage mistakes end in one line and exit status 2, numeric options with bounds,
and how a command ends on Ctrl+C, SIGTERM or a write the disk refuses (one line, 130, 143 or 1).

The commands themselves: ``commands`` (what each does and prints), ``main`` (the ``rmsnorm-kernel``
program: its parser and the checks of its arguments).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import sys
from collections.abc import Callable

from .. import signals
from ..files import WRITE_ERRNOS

OK, FAILED, USAGE = 0, 1, 2
#: The exit status of a command stopped by a signal: 128 + the signal's number, as a shell reports it.
INTERRUPTED = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}


# --------------------------------------------------------------------------------------------------
# Usage mistakes: one line, exit status 2


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes end in one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(USAGE, f"{self.prog}: {message}\n")


def at_least(minimum: float, kind: type = int, maximum: float | None = None):
    """An argparse ``type``: a number of ``kind`` no smaller than ``minimum`` (and no larger than ``maximum``)."""
    accepted = f"{minimum} or more" if maximum is None else f"{minimum} to {maximum}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; accepted: {accepted}") from None
        if not math.isfinite(value):  # nan and inf parse as floats
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; accepted: {accepted}")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text} is too small; accepted: {accepted}")
        if maximum is not None and not value <= maximum:
            raise argparse.ArgumentTypeError(f"{text} is too large; accepted: {accepted}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


# --------------------------------------------------------------------------------------------------
# Ctrl+C and SIGTERM


Terminated = signals.Terminated


def interrupt_status(exc: BaseException) -> tuple[str, int]:
    """(signal name, exit status) of a ``KeyboardInterrupt`` or ``Terminated``."""
    name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    return name, INTERRUPTED[name]


def run_interruptible(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status; Ctrl+C (SIGINT) or SIGTERM, whatever ``body`` is doing, ends it with one
    line on stderr and exit status 130 or 143. SIGTERM is turned into ``Terminated`` while ``body`` runs,
    so its ``finally`` blocks and context managers run on the way out, as they do for Ctrl+C. A write the
    disk refuses (``WRITE_ERRNOS``: a full disk, a read-only file system) ends it with one line and exit
    status 1; files already written stay as they are.

    The one mechanism of every check command and of ``python -m benchmarks.*``. Before ``body``, while
    the command starts, ``signals.guard`` has the signals; after it, in a command, they are ignored, so
    that one arriving while Python shuts down cannot replace the status ``body`` decided
    (``signals.command_takes_over``)."""
    done = signals.command_takes_over()
    status = FAILED
    try:
        status = body()
    except (KeyboardInterrupt, Terminated) as exc:
        name, status = interrupt_status(exc)
        print(f"{prog}: stopped by {name}; exit status {status}", file=sys.stderr)
    except OSError as exc:  # a full disk, say, while writing results: one line, not a traceback
        if exc.errno not in WRITE_ERRNOS:
            raise
        cause = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write failed"
        where = exc.filename or "its output"
        print(f"{prog}: {cause}: {os.strerror(exc.errno)}, writing {where}; exit status {FAILED}", file=sys.stderr)
        status = FAILED
    finally:
        done()
    return status
