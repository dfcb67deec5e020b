"""What the measurements share: their command lines, their exit statuses and an earlier run's file kept."""

import pytest

from benchmarks.common import OneLineParser, at_least, exit_status, keep_earlier_run


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


def test_a_measurement_with_failed_rows_exits_1_with_one_line_and_without_none(capsys):
    assert exit_status("benchmark", 0, "row(s) off the oracle") == 0
    assert capsys.readouterr().err == ""
    assert exit_status("benchmark", 2, "row(s) off the oracle (the table above)") == 1
    assert capsys.readouterr().err == "benchmark: 2 row(s) off the oracle (the table above); exit status 1\n"
