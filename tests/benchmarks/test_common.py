"""What the measurements share: their command lines and their JSON files."""

import errno
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from benchmarks.common import OneLineParser, at_least, exit_status, keep_earlier_run, write_json


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


def test_a_command_line_mistake_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="prog")
    parser.add_argument("--samples", type=at_least(1), default=1)
    parser.add_argument("--ms", type=at_least(0.5, float), default=1.0)
    assert parser.parse_args(["--samples", "3", "--ms", "0.5"]).samples == 3
    for argv, words in (
        (["--samples", "0"], "argument --samples: 0 is too small; accepted: 1 or more"),
        (["--samples", "1.5"], "argument --samples: '1.5' is not a number; accepted: 1 or more"),
        (["--ms", "nan"], "argument --ms: 'nan' is not a finite number; accepted: 0.5 or more"),
        (["--ms", "inf"], "argument --ms: 'inf' is not a finite number; accepted: 0.5 or more"),
        (["--fast"], "unrecognized arguments: --fast"),
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2 and capsys.readouterr().err == f"prog: {words}\n"


def test_an_earlier_run_s_file_is_kept_under_a_free_name_and_said_so(tmp_path, capsys):
    path = tmp_path / "r.json"
    keep_earlier_run("cmd", path)  # nothing there: nothing moved, nothing said
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""
    for run in ("first", "second"):
        path.write_text(run)
        keep_earlier_run("cmd", path)
    assert not path.exists()
    assert [(p.name, p.read_text()) for p in sorted(tmp_path.iterdir())] == [
        ("r.json.prev1", "first"),
        ("r.json.prev2", "second"),
    ]
    assert capsys.readouterr().out.splitlines() == [
        f"cmd: {path} held an earlier run; kept as {path}.prev1",
        f"cmd: {path} held an earlier run; kept as {path}.prev2",
    ]
    keep_earlier_run("cmd", None)  # a command asked to write no file


def test_a_write_the_disk_refuses_leaves_the_earlier_file_and_no_half_one(tmp_path, monkeypatch):
    path = write_json(tmp_path / "x.json", {"a": 1})

    def full(fd):  # the bytes were handed over; the disk refuses them when they are flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_json(path, {"b": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"] and json.loads(path.read_text()) == {"a": 1}


def test_a_measurement_with_failed_rows_exits_1_with_one_line_and_without_none(capsys):
    assert exit_status("benchmark", 0, "row(s) off the oracle") == 0
    assert capsys.readouterr().err == ""
    assert exit_status("benchmark", 2, "row(s) off the oracle (the table above)") == 1
    assert capsys.readouterr().err == "benchmark: 2 row(s) off the oracle (the table above); exit status 1\n"
