"""What the measurements share: their exit statuses and an earlier run's file kept."""

from benchmarks.common import exit_status, keep_earlier_run


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
