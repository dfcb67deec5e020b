"""The sweep's command: its plan, its run files, --skip-done, --merge, usage mistakes, signals, exit status.

The runs here use ``--shapes tiny`` through Triton's interpreter, which is what the command does without
a GPU, or fake measurements; nothing is timed.
"""

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.common import keep_previous, write_json
from benchmarks.impls import MODES, make_impl
from benchmarks.rows import Result
from benchmarks.sweep import figures as sf
from benchmarks.sweep import measure as sm
from benchmarks.sweep import report as sr
from benchmarks.sweep import results
from benchmarks.sweep import run as sweep
from benchmarks.sweep.points import sweep_points
from benchmarks.timing import no_timer
from rmsnorm_kernel.atomic import temporary_path
from rmsnorm_kernel.checks import generated
from rmsnorm_kernel.ops.backend import CUDA, backend
from tests.helpers import DEVICE, ROOT, markdown_rows

from .helpers import sweep_row, sweep_run, tiny_rows, write_run

no_gpu_only = pytest.mark.skipif(backend() == CUDA, reason="what the command does without a GPU")
TINY_IDS = [p.id for p in sweep_points("tiny")]


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the command run in this process; argparse's exits included."""
    try:
        rc = sweep.main([str(a) for a in argv])
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# --------------------------------------------------------------------------------------------------
# The plan and the runs


def test_origins_picks_the_points_a_run_measures_and_leaves_the_rest_to_do(capsys):
    rc, out, _ = run_main(capsys, "--plan", "--no-noise", "--origins", "narrow,batch")
    assert rc == 0
    assert "this run: 35 point(s) + 0 noise repeat(s)" in out  # 19 narrow, 16 batch
    assert "; 129 point(s) of other origins left for another run" in out
    listed = [line.split()[2] for line in out.splitlines() if line.startswith("  ")]
    assert len(listed) == 35 and set(listed) == {"narrow", "batch"}
    rc, _, err = run_main(capsys, "--plan", "--origins", "narrow,qk")
    assert rc == 2 and "unknown qk; accepted: a comma-separated subset of sweep,outside,small," in err


def test_plan_lists_the_points_and_the_compiles_on_any_machine(capsys):
    rc, out, _ = run_main(capsys, "--plan")
    assert rc == 0
    assert "164 points (82 fit, 82 report), 0 already done" in out
    assert "this run: 164 point(s) + 4 noise repeat(s)" in out and "336 torch.compile graphs" in out
    assert out.count(" noise repeat\n") == 4 and "  large:bfloat16:65536x4096  fit    sweep      512.0 MiB\n" in out
    rc, out, _ = run_main(capsys, "--plan", "--no-noise", "--impls", "triton,F.rms_norm")
    assert rc == 0 and "+ 0 noise repeat(s), impls triton,F.rms_norm, 0 torch.compile graphs" in out


@no_gpu_only
def test_without_a_gpu_only_the_tiny_sweep_runs(tmp_path, capsys):
    rc, _, err = run_main(capsys, "--outputs", tmp_path)
    assert rc == 2 and err.strip().splitlines() == [
        "sweep: no CUDA GPU here, so nothing can be timed; without one only --shapes tiny runs "
        "(correctness only), not --shapes sweep"
    ]
    assert list(tmp_path.iterdir()) == []
    rc, _, err = run_main(capsys, "--shapes", "tiny", "--require-gpu", "--outputs", tmp_path)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


@no_gpu_only
def test_a_tiny_sweep_writes_its_run_file_and_merges_it(tmp_path, capsys):
    rc, out, err = run_main(capsys, "--shapes", "tiny", "--outputs", tmp_path)
    assert rc == 0, out + err
    assert "correctness only" in err and "## Worst ratios" in out
    (run,) = results.read_runs(tmp_path / "benchmark-sweep.run.jsonl")
    assert run["kind"] == results.RUN_KIND and run["complete"] and run["timed"] is False and run["ceilings"] == []
    assert run["impls"] == ["triton", "reference", "F.rms_norm", "seed"] and run["skipped_done"] == 0
    merged = json.loads((tmp_path / sr.MERGED_JSON).read_text())
    assert merged["missing"] == [] and len(merged["runs"]) == 1
    assert {r["impl"] for r in merged["rows"]} == {"triton", "reference", "F.rms_norm", "seed"}
    assert all(r["ok"] for r in merged["rows"])
    assert sum(r["repeat"] == 0 for r in merged["rows"]) == 4 * 4 * 2  # four points, four impls, two directions
    assert sum(r["repeat"] == 1 for r in merged["rows"]) == 1 * 4 * 2  # the noise point, measured again
    assert (tmp_path / sr.MERGED_MD).read_text().startswith("# Benchmark sweep")
    assert not (tmp_path / "figures" / sf.FIGURE).exists()  # no timings: no figure
    # --merge alone, no GPU needed: every run file of --outputs by default, the same merged rows
    (tmp_path / sr.MERGED_JSON).unlink()
    rc, out, _ = run_main(capsys, "--merge", "--outputs", tmp_path)
    assert rc == 0 and json.loads((tmp_path / sr.MERGED_JSON).read_text())["rows"] == merged["rows"]


def test_a_figure_that_raises_is_one_failed_line_and_the_merge_still_ends(tmp_path, capsys, monkeypatch):
    write_run(tmp_path / "benchmark-sweep.run.jsonl", sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))

    def broken(json_path, out):
        raise ValueError("Number of columns must be a positive integer, not 0")

    monkeypatch.setattr(sf, "sweep_figure", broken)
    rc, out, err = run_main(capsys, "--merge", "--outputs", tmp_path)
    assert rc == 0 and (tmp_path / sr.MERGED_JSON).is_file()
    assert f"figure {sf.FIGURE}: failed (ValueError: Number of columns" in out and "Traceback" not in out + err


def test_a_merge_with_a_wrong_triton_row_exits_1_with_one_line_naming_it(tmp_path, capsys):
    rows = tiny_rows(TINY_IDS[0])
    rows[0] = dict(rows[0], ok=False, detail="y outside tolerance")
    assert rows[0]["impl"] == "triton"
    write_run(tmp_path / "benchmark-sweep.run.jsonl", sweep_run(rows, shapes="tiny"))
    rc, out, err = run_main(capsys, "--merge", "--outputs", tmp_path)
    assert rc == 1 and (tmp_path / sr.MERGED_JSON).is_file()
    last = err.strip().splitlines()[-1]
    assert last.startswith("sweep: 1 Triton row(s) off the oracle (first: ") and last.endswith("exit status 1")
    assert rows[0]["point"] in last and "Traceback" not in out + err


@no_gpu_only
def test_skip_done_runs_only_what_an_earlier_run_left_and_merges_both(tmp_path, capsys):
    earlier = tmp_path / "earlier.jsonl"
    rows = tiny_rows(TINY_IDS[0]) + tiny_rows(TINY_IDS[1]) + tiny_rows(TINY_IDS[2], repeat=1)
    write_run(earlier, sweep_run(rows, shapes="tiny"))
    rc, out, _ = run_main(
        capsys, "--shapes", "tiny", "--skip-done", earlier, "--no-noise", "--impls", "triton", "--outputs", tmp_path
    )
    assert rc == 0, out
    (data,) = results.read_runs(tmp_path / "benchmark-sweep.run.after2.jsonl")
    assert data["skipped_done"] == 2 and sorted({r["point"] for r in data["rows"]}) == sorted(TINY_IDS[2:])
    merged = json.loads((tmp_path / sr.MERGED_JSON).read_text())
    assert [r["file"] for r in merged["runs"]] == [str(earlier), str(tmp_path / "benchmark-sweep.run.after2.jsonl")]
    assert merged["missing"] == []


def test_the_line_a_stopped_run_prints_resumes_it_with_its_own_options(tmp_path):
    """Its options, and --skip-done with the earlier files and its own: parsed again, the same run."""
    argv = ["--shapes", "tiny", "--outputs", tmp_path / "my out", "--impls", "triton,seed", "--no-noise"]
    argv += ["--origins", "narrow,batch", "--rep-ms", "7", "--skip-done", tmp_path / "a.json"]
    args = sweep.build_parser().parse_args([str(a) for a in argv])
    path = sweep.run_path(args.outputs, 2)
    line = sweep.resume_command(args, path)
    assert line.startswith("python -m benchmarks.sweep ")
    again = sweep.build_parser().parse_args(shlex.split(line)[3:])
    assert again.skip_done == [tmp_path / "a.json", path]
    assert vars(again) == dict(vars(args), skip_done=again.skip_done)


def test_a_run_that_would_write_over_its_own_skip_done_file_is_refused(tmp_path, capsys):
    """All points done already: the run would write after<4>.jsonl, which is one of its inputs."""
    done = tmp_path / "benchmark-sweep.run.after4.jsonl"
    write_run(done, sweep_run([r for p in TINY_IDS for r in tiny_rows(p)], shapes="tiny"))
    before = done.read_bytes()
    rc, out, err = run_main(capsys, "--shapes", "tiny", "--outputs", tmp_path, "--skip-done", done)
    assert rc == 2 and err.strip().splitlines() == [
        f"sweep: --skip-done {done} is the file this run would write (after the same 4 points); "
        "accepted: another --outputs, or the file moved elsewhere first"
    ]
    assert done.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [done.name]


@pytest.mark.parametrize("twice", ["path", "copy"])
def test_a_run_merged_twice_is_refused_not_counted_as_noise(tmp_path, capsys, twice):
    run = tmp_path / "a.json"
    write_run(run, sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    other = run if twice == "path" else tmp_path / "copy.json"
    if twice == "copy":
        other.write_bytes(run.read_bytes())
    rc, _, err = run_main(capsys, "--merge", run, other, "--outputs", tmp_path / "out")
    assert rc == 2 and err.strip().splitlines() == [
        f"sweep: --merge: {other} is given twice; accepted: each file once"
        if twice == "path"
        else f"sweep: --merge: {other} holds the same run as {run}; accepted: each run once"
    ]
    assert not (tmp_path / "out").exists()  # a refused merge makes no folder


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda lines: lines[:1] + ['{"kind":"point","rows":[1]}'], "line 2: lacks 'point'"),
        (
            lambda lines: (
                lines
                + [
                    '{"kind":"point","point":"x","regime":"tiny","origin":"tiny","split":"fit","M":1,'
                    '"N":1,"dtype":"float32","repeat":0,"rows":[1]}'
                ]
            ),
            "a row of x is not an object",
        ),
        (lambda lines: [lines[0].replace('"shapes":"tiny"', '"shapes":"bogus"'), *lines[1:]], "its shapes 'bogus'"),
        (lambda lines: lines[:1] + ["{not json", *lines[1:]], "line 2 is not JSON"),
        (lambda lines: lines + ['{"kind":"notes"}'], "its kind 'notes' is none of"),
    ],
    ids=["a point line without its point", "a number for a row", "unknown shapes", "a line not JSON", "a strange kind"],
)
def test_a_damaged_results_file_is_one_line_and_exit_2(tmp_path, capsys, damage, words):
    run = write_run(tmp_path / "a.jsonl", sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    run.write_text("\n".join(damage(run.read_text().splitlines())) + "\n")
    for option in ("--merge", "--skip-done"):
        rc, _, err = run_main(capsys, "--shapes", "tiny", option, run, "--outputs", tmp_path / "out")
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and f"{option}: {run} is not a sweep results file" in lines[0], err
        assert words in lines[0]


def test_a_run_appends_one_line_per_point_and_a_last_line_cut_short_is_left_out(tmp_path):
    """The file grows by a line per point (never rewritten), and reads back as the rows given; a line a
    killed run left half written is not read, and the run reads as incomplete."""
    points = sweep_points("tiny")[:2]
    path = tmp_path / "r.jsonl"
    write = results.RunFile(path, dict(shapes="tiny", definition="d", device="GPU", commit="abc123"))
    rows: list = []
    sizes = [path.stat().st_size]
    for point in points:
        rows += [sm.Row.of(point, Result("", 1, 1, "", m, "triton", True, "", 0.0, 0.0, 8), 0) for m in MODES]
        rows[-1].gpu_us = 12.3456789
        firsts = path.read_text()
        write(rows, [], points[len(sizes) :], 1.0)
        sizes.append(path.stat().st_size)
        assert path.read_text().startswith(firsts)  # appended to, never rewritten
    assert len(path.read_text().splitlines()) == 3  # the run's line, then one line per point
    write(rows, [dict(regime="tiny", when="end", gpu_tbps=1.0)], [], 2.0, done=True)
    (run,) = results.read_runs(path)
    assert run["complete"] and run["commit"] == "abc123" and run["elapsed_s"] == 2.0
    assert [(r["point"], r["mode"]) for r in run["rows"]] == [(r.point, r.mode) for r in rows]
    assert run["rows"][-1]["gpu_us"] == 12.3457 and run["ceilings"] == [dict(regime="tiny", when="end", gpu_tbps=1.0)]
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n" + '{"kind":"point","point":')
    (run,) = results.read_runs(path)
    assert not run["complete"] and {r["point"] for r in run["rows"]} == {points[0].id}


@pytest.mark.parametrize("obstacle", ["benchmark-sweep.json/", "benchmark-sweep.md/", "figures"])
def test_merging_where_a_merged_file_cannot_go_is_refused_before_writing(tmp_path, capsys, obstacle):
    run = tmp_path / "a.json"
    write_run(run, sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    out = tmp_path / "out"
    out.mkdir()
    (out / obstacle.rstrip("/")).mkdir() if obstacle.endswith("/") else (out / obstacle).write_text("")
    rc, _, err = run_main(capsys, "--merge", run, "--outputs", out)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and f"--outputs {out} holds a" in lines[0], err
    assert sorted(p.name for p in out.iterdir()) == [obstacle.rstrip("/")]


def test_plan_and_merge_together_are_refused(tmp_path, capsys):
    rc, _, err = run_main(capsys, "--plan", "--merge", "--outputs", tmp_path / "out")
    assert rc == 2 and err.strip().splitlines() == [
        "sweep: --plan and --merge together: --plan writes nothing, --merge writes; accepted: one of them"
    ]
    assert not (tmp_path / "out").exists()


def test_merging_again_keeps_the_earlier_merged_files(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_run(first, sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    write_run(second, sweep_run(tiny_rows(TINY_IDS[1]), shapes="tiny", date="2026-01-02T00:00:00+00:00"))
    out = tmp_path / "out"
    assert run_main(capsys, "--merge", first, second, "--outputs", out)[0] == 0
    both = {name: (out / name).read_bytes() for name in (sr.MERGED_JSON, sr.MERGED_MD)}
    assert run_main(capsys, "--merge", first, "--outputs", out)[0] == 0
    for name, content in both.items():
        assert (out / f"{name}.prev1").read_bytes() == content  # the earlier merge, kept
        assert (out / name).read_bytes() != content
    assert not list(out.glob("*.tmp"))


def test_merge_by_default_takes_the_runs_in_the_order_they_started(tmp_path, capsys):
    out = tmp_path / "out"
    write_run(out / "benchmark-sweep.run.jsonl", sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    write_run(  # named after100: sorts first by name, though it started later
        out / "benchmark-sweep.run.after100.jsonl",
        sweep_run(tiny_rows(TINY_IDS[1]), shapes="tiny", date="2026-01-02T00:00:00+00:00"),
    )
    assert run_main(capsys, "--merge", "--outputs", out)[0] == 0
    merged = json.loads((out / sr.MERGED_JSON).read_text())
    assert [r["file"] for r in merged["runs"]] == [
        str(out / "benchmark-sweep.run.jsonl"),
        str(out / "benchmark-sweep.run.after100.jsonl"),
    ]


@no_gpu_only
def test_without_a_gpu_impls_that_all_need_one_are_refused(tmp_path, capsys):
    rc, _, err = run_main(capsys, "--shapes", "tiny", "--impls", "compile,liger", "--outputs", tmp_path)
    assert rc == 2 and err.strip().splitlines() == [
        "sweep: --impls compile,liger: none of them runs without a CUDA GPU; "
        "accepted here: a subset of triton,reference,F.rms_norm,seed"
    ]
    assert list(tmp_path.iterdir()) == []


@no_gpu_only
def test_stopped_in_the_noise_repeats_with_every_point_measured_it_merges(tmp_path, capsys, monkeypatch):
    done = tmp_path / "done.json"
    write_run(done, sweep_run([r for p in TINY_IDS for r in tiny_rows(p)], shapes="tiny"))

    @contextlib.contextmanager
    def stopped_at_once():
        yield lambda: "SIGINT"

    monkeypatch.setattr(sweep, "stop_on_signal", stopped_at_once)
    rc, _, err = run_main(capsys, "--shapes", "tiny", "--skip-done", done, "--outputs", tmp_path / "out")
    assert rc == 130 and err.strip().splitlines()[-1] == (
        "sweep: stopped by SIGINT in the noise repeats; every point was measured and merged"
    )
    assert json.loads((tmp_path / "out" / sr.MERGED_JSON).read_text())["missing"] == []


def _fake_points(monkeypatch, ok=True, timed=True):
    """The command as on a GPU, with every measurement faked: rows of the asked ok-ness and timing."""
    monkeypatch.setattr(sweep, "backend", lambda: CUDA)
    monkeypatch.setattr(sweep.torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(sweep, "CudaTimers", lambda *a: None)
    monkeypatch.setattr(
        sweep,
        "measure_ceiling",
        lambda regime, nbytes, timer, when: dict(
            regime=regime, when=when, bytes=2 * nbytes, gpu_tbps=4.0, whole_tbps=3.9, gpu_method="do_bench"
        ),
    )

    def measure_point(point, impls, device, timer, repeat, impl_factory, log):
        rows = []
        for impl in impls:
            for mode in MODES:
                r = Result("", 1, 1, "", mode, impl, ok or impl != "triton", "", 0.0, 0.0, 8)
                r.events_us = r.gpu_us = r.host_us = 10.0 if timed else None
                rows.append(sm.Row.of(point, r, repeat))
        return rows

    monkeypatch.setattr(sweep, "measure_point", measure_point)


@pytest.mark.slow
@pytest.mark.parametrize(
    "ok, timed, status, says",
    [(True, True, 0, None), (False, True, 1, "Triton FAILED at"), (True, False, 1, "no timing at")],
    ids=["right", "wrong", "untimed"],
)
def test_exit_status_of_a_run_on_a_gpu(tmp_path, capsys, monkeypatch, ok, timed, status, says):
    _fake_points(monkeypatch, ok, timed)
    rc, out, _ = run_main(capsys, "--impls", "triton,F.rms_norm", "--no-noise", "--outputs", tmp_path)
    assert rc == status
    assert says is None or says in out
    (run,) = results.read_runs(tmp_path / "benchmark-sweep.run.jsonl")
    assert len(run["rows"]) == 164 * 2 * 2 and run["timed"] and run["device"] == "fake GPU"
    assert {(c["regime"], c["when"]) for c in run["ceilings"]} == {
        (regime, when) for regime in ("large", "mid", "act64", "act128", "act256") for when in ("start", "end")
    }  # the small points are no regime of their own


# --------------------------------------------------------------------------------------------------
# The results page


def test_report_writes_the_page_and_its_figure_from_the_results_file_and_names_its_command(tmp_path, capsys):
    point = "large:bfloat16:65536x4096"
    rows = [
        sweep_row(point, impl, mode, gpu=gpu, whole=gpu + 5, host=3.0)
        for impl, gpu in (("triton", 500.0), ("compile", 550.0))
        for mode in MODES
    ]
    first = dict(sweep_run(rows), commit="0123456789ab", date="2026-03-04T05:06:07+00:00")
    second = dict(sweep_run(tiny_rows(TINY_IDS[0]), shapes="sweep"), commit="ba9876543210")  # a second run
    results_file = tmp_path / "data" / "sweep.jsonl"
    results_file.parent.mkdir()
    results_file.write_text(results.run_lines(first) + results.run_lines(second))
    page = tmp_path / "docs" / "speed.md"
    rc, out, err = run_main(capsys, "--report", page, "--results", results_file)
    assert rc == 0, out + err
    text = page.read_text()
    assert text.startswith(
        f"# Speed\n\nGenerated by `python -m benchmarks.sweep --report {page} --results {results_file}`"
    )
    assert (
        "NVIDIA" not in text
        and "GPU; torch 2.11, Triton 3.6, liger-kernel 0.8.5; commit 0123456789ab, ba9876543210;" in text
    )
    assert "![TB/s against N](speed.png)" in text and (tmp_path / "docs" / "speed.png").stat().st_size > 0
    # one line per group and direction: 550 us against 500 us is 1.10x the fastest peer; 2 x 65536 x 4096
    # bfloat16 bytes in 500 us are 2.15 TB/s, 51% of the run's copy ceiling of 4.2 TB/s
    assert [
        *("every hidden size 1000-16384, x of 512 MiB", "forward", "1", "51%", "1 of 1", "1.10x"),
        "1.10x (bfloat16 65536x4096, compile)",
    ] in markdown_rows(text)
    assert "## Worst ratios" in text and f"wrote {page}" in out


def test_report_refuses_a_file_that_is_no_results_and_a_page_that_is_not_markdown(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind": "benchmark"}\n')
    rc, _, err = run_main(capsys, "--report", tmp_path / "speed.md", "--results", bad)
    assert rc == 2 and err.strip().splitlines() == [
        f"sweep: --results: {bad} is not a sweep results file (ValueError: line 1 comes before any run's line: "
        "not written by a run of the sweep)"
    ]
    good = write_run(tmp_path / "r.jsonl", sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    rc, _, err = run_main(capsys, "--report", tmp_path / "speed.txt", "--results", good)
    assert rc == 2 and "not a .md file" in err and not (tmp_path / "speed.txt").exists()
    rc, _, err = run_main(capsys, "--report", tmp_path / "speed.md", "--merge")
    assert rc == 2 and "--report with --plan or --merge" in err


def test_the_committed_results_make_the_committed_page(tmp_path, capsys):
    """docs/speed.md is what the report command writes from docs/data/sweep.jsonl, not an edited copy."""
    page = tmp_path / "speed.md"
    rc, out, err = run_main(capsys, "--report", page, "--results", ROOT / results_default())
    assert rc == 0, out + err
    made = page.read_text().split("\n", 3)[3]  # past the line naming the command (another path here)
    assert (ROOT / "docs" / "speed.md").read_text().split("\n", 3)[3] == made


def results_default():
    return sweep.RESULTS


# --------------------------------------------------------------------------------------------------
# Usage mistakes: one line, exit 2, nothing written


def _bad_files(tmp_path):
    (tmp_path / "not-a-run.json").write_text(json.dumps({"kind": "benchmark", "results": []}))
    write_run(tmp_path / "tiny-run.json", sweep_run(tiny_rows(TINY_IDS[0]), shapes="tiny"))
    (tmp_path / "a-file").write_text("")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--impls", ","], "',' names no implementation"),
        (["--impls", "triton,cuda"], "unknown cuda"),
        (["--whole-ms", "-1"], "argument --whole-ms: -1 is too small"),
        (["--rep-ms", "0"], "argument --rep-ms: 0 is too small"),
        (["--rep-ms", "ten"], "argument --rep-ms: 'ten' is not a number"),
        (["--shapes", "huge"], "argument --shapes: invalid choice"),
        (["--skip-done", "{tmp}/absent.json"], "--skip-done: {tmp}/absent.json does not exist"),
        (["--skip-done", "{tmp}/not-a-run.json"], "before any run's line: not written by a run of the sweep"),
        (["--skip-done", "{tmp}/tiny-run.json"], "is a run of another sweep (tiny"),
        (["--merge", "{tmp}/not-a-run.json"], "--merge: {tmp}/not-a-run.json is not a sweep results file"),
        (["--merge"], "--merge: no run files given and none in {tmp}/out"),
        (
            ["--shapes", "tiny", "--outputs", "{tmp}/a-file/out"],
            "--outputs {tmp}/a-file/out cannot be written (Not a directory)",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_a_usage_mistake_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, argv, words):
    _bad_files(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--outputs" not in argv:
        argv += ["--outputs", str(tmp_path / "out")]
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words.format(tmp=tmp_path) in lines[0], err
    assert "Point" not in out and sorted(p for p in tmp_path.rglob("*") if p.name != "out") == before


# --------------------------------------------------------------------------------------------------
# Interruptions


def test_a_signal_stops_the_sweep_after_the_point_in_progress_and_keeps_what_it_measured():
    points = sweep_points("tiny")[:3]
    written = []
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job

    def factory(name, device):
        if name == "triton" and not written:  # during the first point: Ctrl+C
            os.kill(os.getpid(), signal.SIGINT)
        return make_impl(name, device)

    with sweep.stop_on_signal() as stop:
        rows, _, remaining = sweep.run_points(
            points,
            [],
            ["triton"],
            DEVICE,
            no_timer,
            write=lambda *a, **k: written.append(a),
            impl_factory=factory,
            log=lambda line: None,
            stop=stop,
        )
    assert stop() == "SIGINT"  # no KeyboardInterrupt inside the first point: it ended, and was written
    assert {r.point for r in rows} == {points[0].id} and all(r.ok for r in rows)
    assert remaining == points[1:] and len(written) == 2  # after the point, and the final write
    assert written[-1][2] == points[1:]
    assert signal.getsignal(signal.SIGINT) is before  # given back


def test_running_again_keeps_the_earlier_runs_file_out_of_the_merge(tmp_path):
    path = sweep.run_path(tmp_path)
    assert keep_previous(path) is None  # nothing there yet
    for run in ("first", "second"):
        path.write_text(run)
        keep_previous(path)
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "benchmark-sweep.run.jsonl.prev1",
        "benchmark-sweep.run.jsonl.prev2",
    ]
    assert [p.read_text() for p in sorted(tmp_path.iterdir())] == ["first", "second"]
    assert sorted(tmp_path.glob(f"{sweep.RUN_STEM}*.jsonl")) == []  # what --merge reads by default


def test_clean_knows_every_file_the_sweep_writes(tmp_path):
    outputs = tmp_path / "outputs"
    written = [
        sweep.run_path(outputs),
        sweep.run_path(outputs, 7),
        keep_previous(results.RunFile(sweep.run_path(outputs), {}).path),
        outputs / sr.MERGED_JSON,
        temporary_path(write_json(outputs / sr.MERGED_JSON, {})),
        temporary_path(outputs / sr.MERGED_MD),
        outputs / sr.MERGED_MD,
        outputs / "figures" / sf.FIGURE,
        outputs / f"{sr.MERGED_JSON}.prev1",  # an earlier merge's files, kept by the next merge
        outputs / f"{sr.MERGED_MD}.prev2",
        outputs / "figures" / f"{sf.FIGURE}.prev1",
    ]
    for path in written:
        assert generated.is_generated_file(tmp_path, path.relative_to(tmp_path).as_posix()), path
    assert not generated.is_generated_file(tmp_path, "outputs/benchmark-sweep.notes.md")


# --------------------------------------------------------------------------------------------------
# The command line in its own process


def _sweep_process(tmp_path, *argv, prelude=""):
    code = f"{prelude}\nimport sys\nfrom benchmarks.sweep.run import main\nsys.exit(main({[str(a) for a in argv]!r}))"
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_python_dash_m_refuses_a_usage_mistake_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep", "--impls", ",", "--outputs", tmp_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    # (on a machine without a GPU the package's one warning about the interpreter comes first)
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m benchmarks.sweep: argument --impls: ',' names no implementation; "
        "accepted: a comma-separated subset of triton,reference,F.rms_norm,compile,liger,seed"
    )


@pytest.mark.slow
@no_gpu_only
def test_sigterm_stops_a_run_after_its_point_keeps_the_file_and_exits_143(tmp_path):
    """Each point made to last a second, so that the signal lands during the second one."""
    slow = (
        "import time\nimport benchmarks.sweep.run as r\nm = r.measure_point\n"
        "r.measure_point = lambda *a, **k: (time.sleep(1.0), m(*a, **k))[1]"
    )
    proc = _sweep_process(tmp_path, "--shapes", "tiny", "--outputs", tmp_path, prelude=slow)
    path = tmp_path / "benchmark-sweep.run.jsonl"
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert err.strip().splitlines()[-1].startswith("sweep: stopped by SIGTERM;")
    assert f"--skip-done {path}" in err
    (run,) = results.read_runs(path)
    assert not run["complete"] and 1 <= len({r["point"] for r in run["rows"]}) < 4
    assert not (tmp_path / sr.MERGED_JSON).exists()
