"""What the measurements share: their JSON files."""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import write_json


@dataclass
class Record:
    shape: tuple
    err: float


def test_json_is_written_whole_with_no_nan_or_infinity(tmp_path):
    path = write_json(
        tmp_path / "sub" / "x.json",
        {"rows": [Record((1, 2), math.nan)], "inf": math.inf, "dtype": torch.float16, "where": Path("a/b")},
    )
    assert path == tmp_path / "sub" / "x.json" and [p.name for p in path.parent.iterdir()] == ["x.json"]
    data = json.loads(path.read_text())  # strict JSON: Python's reader would take NaN, so check the text too
    assert data == {"rows": [{"shape": [1, 2], "err": None}], "inf": None, "dtype": "torch.float16", "where": "a/b"}
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_a_file_is_replaced_not_appended_to(tmp_path):
    write_json(tmp_path / "x.json", {"a": 1})
    write_json(tmp_path / "x.json", {"b": 2})
    assert json.loads((tmp_path / "x.json").read_text()) == {"b": 2}
