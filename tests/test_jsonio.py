"""The one JSON writer: standard JSON, NaN and infinities as null, written whole."""

import errno
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.jsonio import dumps, write_json


@dataclass
class Record:
    shape: tuple
    err: float


def strict_json(name):
    raise ValueError(f"{name} is not standard JSON")


def test_json_is_written_whole_with_no_nan_or_infinity(tmp_path):
    path = write_json(
        tmp_path / "sub" / "x.json",
        {"rows": [Record((1, 2), math.nan)], "inf": math.inf, "dtype": torch.float16, "where": Path("a/b")},
    )
    assert path == tmp_path / "sub" / "x.json" and [p.name for p in path.parent.iterdir()] == ["x.json"]
    data = json.loads(path.read_text(), parse_constant=strict_json)  # Python's reader would take NaN
    assert data == {"rows": [{"shape": [1, 2], "err": None}], "inf": None, "dtype": "torch.float16", "where": "a/b"}


def test_a_metric_not_measured_here_is_null_at_any_depth():
    report = {"runs": [{"time/rmsnorm_ms": float("nan"), "test/mse": 0.5, "x": [float("-inf"), 1.0]}]}
    assert json.loads(dumps(report), parse_constant=strict_json) == {
        "runs": [{"time/rmsnorm_ms": None, "test/mse": 0.5, "x": [None, 1.0]}]
    }


def test_without_indent_the_text_is_one_line_without_spaces():
    assert dumps({"a": [1, (2, 3)], "b": math.nan}, indent=None) == '{"a":[1,[2,3]],"b":null}'


def test_a_file_is_replaced_not_appended_to(tmp_path):
    write_json(tmp_path / "x.json", {"a": 1})
    write_json(tmp_path / "x.json", {"b": 2})
    assert json.loads((tmp_path / "x.json").read_text()) == {"b": 2}


def test_a_write_the_disk_refuses_leaves_the_earlier_file_and_no_half_one(tmp_path, monkeypatch):
    path = write_json(tmp_path / "x.json", {"a": 1})

    def full(fd):  # the bytes were handed over; the disk refuses them when they are flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_json(path, {"b": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"] and json.loads(path.read_text()) == {"a": 1}
