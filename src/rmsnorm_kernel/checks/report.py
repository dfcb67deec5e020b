"""What every check command shares: names and one-line errors for its records, and its JSON report."""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path

import torch

from ..files import WRITE_ERRNOS  # noqa: F401  (re-exported: the check commands take it from here)
from ..jsonio import write_json
from ..ops.backend import backend, kernel_device_type


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: enough for a table cell; some errors carry whole tracebacks."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def digits(v: float) -> str:
    """Seven significant digits: enough to tell 0.9999995 from 1."""
    return "-" if math.isnan(v) else f"{v:.7g}"


def outputs_problem(outputs: Path) -> str | None:
    """Why the folder ``outputs`` cannot take a command's files (None when it can). It is created if
    missing and test-written, so that a command refuses before its work rather than losing it at the end."""
    if outputs.exists() and not outputs.is_dir():
        return f"--outputs {outputs} is a file, not a folder; accepted: a folder this user can create and write"
    try:
        outputs.mkdir(parents=True, exist_ok=True)
        probe = outputs / f".write-probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or exc
        return f"--outputs {outputs} cannot be written ({why}); accepted: a folder this user can create and write"
    return None


def report_path(outputs: Path, command: str) -> Path:
    """Where ``write_report`` writes the report of ``command``: ``<outputs>/<command>.json``."""
    return outputs / f"{command}.json"


def write_report(outputs: Path, command: str, ok: bool, body: dict) -> Path:
    """``<outputs>/<command>.json`` (``report_path``) with what every report carries, then ``body``
    (written by ``jsonio.write_json``: NaN and infinities as null)."""
    path = report_path(outputs, command)
    report = {
        "command": command,
        "ok": ok,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": backend(),
        "device": kernel_device_type(),
        "torch": torch.__version__,
        **body,
    }
    return write_json(path, report)
