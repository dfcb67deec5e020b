"""What every check command shares: names and one-line errors for its records, its table, its JSON report."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from ..files import WRITE_ERRNOS  # noqa: F401  (re-exported: the check commands take it from here)
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


def cell(v) -> str:
    """A value as a table shows it: yes/no, three significant digits, '-' for NaN, tuples in parentheses."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3g}"
    if isinstance(v, tuple):
        return "(" + ", ".join(map(str, v)) + ")"
    return str(v)


def digits(v: float) -> str:
    """Seven significant digits: enough to tell 0.9999995 from 1."""
    return "-" if math.isnan(v) else f"{v:.7g}"


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence], right: Iterable[int] = (), groups: Sequence | None = None
) -> str:
    """``rows`` under ``headers``, each value as ``cell`` writes it; the columns in ``right`` aligned right,
    the others left; a blank line wherever ``groups`` (one key per row) changes."""
    right = set(right)
    cells = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    for i, r in enumerate(cells[1:]):
        if groups is not None and i and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(line(r))
    return "\n".join(lines)


def jsonable(obj):
    """``obj`` with dataclasses, tuples, dtypes, paths and non-finite floats turned into JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "nan", "inf": standard JSON has no such numbers
    if isinstance(obj, (torch.dtype, Path)):
        return str(obj)
    return obj


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
    """``<outputs>/<command>.json`` (``report_path``) with what every report carries, then ``body``."""
    outputs.mkdir(parents=True, exist_ok=True)
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
    path.write_text(json.dumps(jsonable(report), indent=2) + "\n")
    return path
