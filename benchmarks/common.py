"""What several measurements of ``benchmarks`` share: their command lines (one-line usage errors, numeric
options with a lower bound) and writing their JSON files."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import torch


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes end in one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def at_least(minimum: float, kind: type = int):
    """An argparse ``type``: a number of ``kind`` no smaller than ``minimum``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; accepted: {minimum} or more") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text} is too small; accepted: {minimum} or more")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def plain(obj):
    """``obj`` as JSON values: dataclasses as dicts, tuples as lists, dtypes and paths as text, and NaN or
    infinite numbers as None (JSON has no such numbers)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (torch.dtype, Path)):
        return str(obj)
    return obj


def write_json(path: Path, data) -> Path:
    """``data`` (see ``plain``) as JSON at ``path``, written whole or not at all: to ``<path>.tmp``, then
    renamed over ``path``, so that a reader or an interrupted run never meets half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plain(data), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
    return path
