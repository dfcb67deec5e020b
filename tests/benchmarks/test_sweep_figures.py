"""The sweep's figure, from hand-written merged rows."""

import json

from benchmarks.sweep import figures as sf
from benchmarks.sweep.points import sweep_points
from benchmarks.sweep.report import MERGED_KIND

from .helpers import sweep_run, tiny_rows
from .test_sweep_report import synthetic_merged

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_sweep_figure_draws_every_panel(tmp_path):
    path = tmp_path / "benchmark-sweep.json"
    path.write_text(json.dumps(synthetic_merged()))
    result = sf.sweep_figure(path, tmp_path / "s.png")
    assert result.status == "written" and (tmp_path / "s.png").read_bytes()[:8] == PNG_MAGIC
    assert {"fwd large/sweep triton bfloat16", "fwd+bwd large/outside compile bfloat16"} <= set(result.series)
    assert "liger" not in " ".join(s for s in result.series if "fwd+bwd" in s)  # its failed row has no point
    untimed = tmp_path / "untimed.json"
    untimed.write_text(
        json.dumps(sweep_run(tiny_rows(sweep_points("tiny")[0].id), shapes="tiny") | {"kind": MERGED_KIND})
    )
    assert sf.sweep_figure(untimed, tmp_path / "u.png").status == "skipped"
    assert sf.sweep_figure(tmp_path / "absent.json", tmp_path / "a.png").status == "skipped"


def test_a_file_that_is_not_the_sweeps_fails_without_raising(tmp_path):
    path = tmp_path / "benchmark-sweep.json"
    path.write_text(json.dumps({"kind": "benchmark", "results": []}))
    result = sf.sweep_figure(path, tmp_path / "s.png")
    assert result.status == "failed" and "is not a sweep file" in result.detail
    assert not (tmp_path / "s.png").exists()


def test_tiny_points_timed_on_a_gpu_are_skipped_by_the_figure_not_drawn_into_zero_panels(tmp_path):
    point = sweep_points("tiny")[0].id
    rows = [sf_row | {"gpu_tbps": 0.5} for sf_row in tiny_rows(point)]
    path = tmp_path / "benchmark-sweep.json"
    path.write_text(json.dumps(sweep_run(rows, shapes="tiny") | {"kind": MERGED_KIND}))
    result = sf.sweep_figure(path, tmp_path / "t.png")
    assert result.status == "skipped" and "no timed row of the large or mid regime" in result.detail
    assert not (tmp_path / "t.png").exists()
