"""JSON out: the one writer of the project's JSON files (check reports, benchmark results, training
summaries), with one rule for the values JSON has no word for.

The rule: a NaN or infinite number is written as ``null`` (standard JSON has no such numbers, and a
strict reader refuses ``NaN``); dataclasses are written as objects, tuples as lists, dtypes and paths as
their text. A reader takes ``null`` where a number is expected as "not measured".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch

from .atomic import write_atomic


def plain(obj):
    """``obj`` as JSON values, by the rule of the module docstring."""
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


def dumps(obj, indent: int | None = 1) -> str:
    """``obj`` (``plain``) as standard JSON text; ``indent=None``: one line without spaces."""
    separators = (",", ":") if indent is None else None
    return json.dumps(plain(obj), indent=indent, separators=separators, allow_nan=False)


def write_json(path: str | os.PathLike, obj) -> Path:
    """``obj`` (``plain``) as JSON at ``path``, written whole or not at all (``atomic.write_atomic``);
    returns ``path``."""
    return write_atomic(path, dumps(obj) + "\n")
