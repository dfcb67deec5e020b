"""What every command's output shares: names, one-line errors, and the JSON report."""

import json
import math
from dataclasses import dataclass

import torch

from rmsnorm_kernel.checks import report


def test_dtype_name_and_power_of_two():
    assert report.dtype_name(torch.bfloat16) == "bfloat16"
    assert [n for n in range(0, 10) if report.is_power_of_two(n)] == [1, 2, 4, 8]


def test_one_line_keeps_the_type_and_the_first_line_only():
    assert report.one_line(RuntimeError("launch failed\n  Traceback ...")) == "RuntimeError: launch failed"
    assert report.one_line(ValueError()) == "ValueError: "


def strict_json(name):
    raise ValueError(f"{name} is not standard JSON")


@dataclass
class Record:
    shape: tuple
    err: float


def test_report_is_standard_json_with_the_common_keys_and_null_for_non_finite_numbers(tmp_path):
    path = report.write_report(
        tmp_path / "out", "check-x", False, {"cases": [Record((1, 2), math.nan)], "dtype": torch.float16}
    )
    assert path == tmp_path / "out" / "check-x.json"
    data = json.loads(path.read_text(), parse_constant=strict_json)
    assert {"command", "ok", "created", "backend", "device", "torch"} <= set(data)
    assert (data["command"], data["ok"], data["torch"]) == ("check-x", False, torch.__version__)
    assert data["cases"] == [{"shape": [1, 2], "err": None}] and data["dtype"] == "torch.float16"


def test_an_outputs_folder_is_created_and_test_written_before_any_work(tmp_path):
    nested = tmp_path / "a" / "b"
    assert report.outputs_problem(nested) is None
    assert nested.is_dir() and list(nested.iterdir()) == []  # the probe is gone
    (tmp_path / "file").write_text("kept")
    problem = report.outputs_problem(tmp_path / "file" / "x")
    assert (
        problem == f"--outputs {tmp_path}/file/x cannot be written (Not a directory); "
        "accepted: a folder this user can create and write"
    )
    assert (tmp_path / "file").read_text() == "kept"
