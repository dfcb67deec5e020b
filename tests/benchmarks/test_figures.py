"""The benchmark's figure, from benchmark results; missing or unusable inputs are reported, not fatal."""

import json

import pytest

from benchmarks import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def benchmark_records(timed=True):
    rows = []
    for shape, m, n in (("1024x257", 1024, 257), ("4096x4096", 4096, 4096)):
        for mode in ("fwd", "fwd+bwd"):
            for impl in ("triton", "reference"):
                us = 10.0 * (2 if impl == "reference" else 1) if timed else None
                rows.append(
                    {
                        "shape": shape,
                        "M": m,
                        "N": n,
                        "dtype": "float16",
                        "mode": mode,
                        "impl": impl,
                        "ok": True,
                        "events_us": us,
                        "bandwidth_tbps": (1.0 / us if timed else None),
                        "max_abs": 0.0,
                    }
                )
    return {"timed": timed, "device": "GPU", "ceiling_tbps": 4.0, "results": rows}


def test_benchmark_figure_from_benchmark_results(tmp_path):
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(benchmark_records()))
    result = figures.benchmark_figure(path, tmp_path / "b.png")
    assert result.status == "written" and is_png(result.path)
    assert {"fwd bandwidth_tbps triton", "fwd+bwd events_us reference"} <= set(result.series)


def test_a_wrong_result_is_left_out_of_the_bars(tmp_path):
    data = benchmark_records()
    data["results"][0]["ok"] = False
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(data))
    result = figures.benchmark_figure(path, tmp_path / "b.png")
    assert result.status == "written" and "2 bar(s) left out because the result was wrong" in result.detail


@pytest.mark.parametrize(
    "content,status,words",
    [
        (None, "skipped", "(run python -m benchmarks.benchmark first)"),
        ("[1, 2", "failed", "not readable JSON"),
        (json.dumps({"answer": 42}), "failed", "no list of result records"),
        (json.dumps(benchmark_records(timed=False)), "skipped", "no timings"),
    ],
)
def test_benchmark_figure_reports_unusable_inputs(tmp_path, content, status, words):
    path = tmp_path / "benchmark.json"
    if content is not None:
        path.write_text(content)
    result = figures.benchmark_figure(path, tmp_path / "b.png")
    assert result.status == status and words in result.detail
    assert not (tmp_path / "b.png").exists()


def test_is_number_takes_finite_numbers_only():
    assert [figures.is_number(v) for v in (1, 2.5, True, float("nan"), float("inf"), "3", None)] == [
        True,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
