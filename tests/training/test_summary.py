"""What a run reports: the summary of one run, the side-by-side table, and the multirun callback."""

import json
from types import SimpleNamespace

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.training.result import RunResult
from rmsnorm_kernel.training.summary import MultirunSummary, format_summary, summary_table
from tests.helpers import markdown_rows

METRICS = {
    "train/mse": 0.5,
    "val/mse": 0.25,
    "test/mse": 0.125,
    "parity/initial_output_err": 2.5e-07,
    "parity/initial_grad_err": 7.5e-09,
    "parity/native_initial_output_err": 1.25e-07,
    "parity/native_initial_grad_err": 0.0,
    "parity/checks": 3.0,
    "parity/worst_over_tol": 0.25,
    "parity/native_worst_over_tol": 0.125,
    "reload/max_abs_diff": 0.0,
    "time/step_ms": 1.5,
}
CALLS = {
    "train/forward": 4,
    "train/backward": 4,
    "train/fallback": 0,
    "val/forward": 2,
    "test/forward": 1,
    "parity/forward": 3,
    "parity/backward": 3,
}


def result(impl="triton", **kw):
    fields = dict(
        name=f"{impl}_seed0",
        impl=impl,
        seed=0,
        backend="interpreter",
        steps=4,
        log_dir=f"runs/{impl}",
        checkpoint=f"ck/{impl}/final.ckpt",
        initial_weights_sha256="0123456789abcdef" * 4,
        metrics=dict(METRICS),
        calls=dict(CALLS),
        seconds=1.25,
    )
    return RunResult(**{**fields, **kw})


def test_the_summary_of_a_run_that_passed():
    assert format_summary(result()).splitlines() == [
        "run triton_seed0: OK",
        "  path triton, backend interpreter, 4 steps, 1.2 s, median step 1.5 ms",
        "  mse: train 0.500000, val 0.250000, test 0.125000",
        "  Triton calls per process (process 0's, as TensorBoard's calls/*): train forward 4, backward 4; "
        "val forward 2, test forward 1; training fallbacks to the reference 0",
        "  initial parity (step 0), triton against the reference: output 2.5e-07, grad 7.5e-09: within the tolerance",
        "  initial parity (step 0), native against the reference: output 1.25e-07, grad 0: within the tolerance",
        "  parity along the run: 3 checks over the run's history, worst difference 0.25 (triton), 0.125 (native) of "
        "the tolerance; their Triton calls: forward 3, backward 3",
        "  reload parity: max |diff| 0.0 (bit-identical)",
        "  logs: runs/triton",
        "  checkpoint: ck/triton/final.ckpt",
    ]


def test_the_summary_gives_the_norms_share_of_a_step_where_a_gpu_measured_it():
    line = format_summary(result(metrics={**METRICS, "time/rmsnorm_ms": 0.375})).splitlines()[1]
    assert (
        line == "  path triton, backend interpreter, 4 steps, 1.2 s, median step 1.5 ms"
        " (RMSNorm layers 0.375 ms of it, 25%, GPU time)"
    )


def test_a_resumed_run_whose_checkpoint_carried_no_verdicts_says_they_are_unknown():
    # docs/resume-and-faults.md, "Verdicts across a resume": never "passed" for what was not seen
    metrics = {**METRICS, "reload/max_abs_diff": 0.5}
    for path in ("", "native_"):  # no path's verdicts
        metrics[f"parity/{path}initial_output_err"] = metrics[f"parity/{path}initial_grad_err"] = None
    lines = format_summary(result(metrics=metrics, failures=["reload parity: one", "integration: two"])).splitlines()
    assert lines[0] == "run triton_seed0: FAILED"
    assert lines[4] == "  initial parity: unknown: the checkpoint this run resumed from carries no parity verdicts"
    assert lines[5].startswith("  parity along the run: ")
    assert lines[6] == "  reload parity: max |diff| 0.5 (DIFFERENT)"
    assert lines[-2:] == ["  check failed: reload parity: one", "  check failed: integration: two"]


def test_a_resumed_run_whose_checkpoint_carried_no_native_verdicts_says_native_is_unknown():
    metrics = {**METRICS, "parity/native_initial_output_err": None, "parity/native_initial_grad_err": None}
    lines = format_summary(result(metrics=metrics)).splitlines()
    assert lines[4:6] == [
        "  initial parity (step 0), triton against the reference: output 2.5e-07, grad 7.5e-09: within the tolerance",
        "  initial parity (step 0), native against the reference: unknown: the checkpoint this run resumed from "
        "carries no verdicts of native",
    ]


@pytest.mark.parametrize("path", ["triton", "native"])
def test_a_failed_initial_parity_says_failed_on_its_paths_line_and_below(path):
    failure = f"initial parity: {path} outputs differ from the reference by 0.0123, gradients by 0.000848, beyond"
    lines = format_summary(result(failures=[failure])).splitlines()
    assert lines[0] == "run triton_seed0: FAILED"
    verdicts = {line.split(",")[1].split()[0]: line.endswith(": FAILED (beyond the tolerance)") for line in lines[4:6]}
    assert verdicts == {"triton": path == "triton", "native": path == "native"}
    assert lines[-1] == f"  check failed: {failure}"


def row(name, test_mse, ok=True, step_ms=2.0, backend="cuda"):
    return {
        "run": name,
        "name": name,
        "path": name.split("_")[0],
        "backend": backend,
        "steps": 100,
        "loss_name": "mse",
        "train/mse": 0.5,
        "val/mse": 0.25,
        "test/mse": test_mse,
        "calls/forward": 100.0,
        "calls/backward": 100.0,
        "parity/initial_output_err": 1.25e-07,
        "parity/initial_grad_err": 0.0,
        "parity/worst_over_tol": 0.5,
        "parity/native_initial_output_err": 2.5e-07,
        "parity/native_initial_grad_err": 0.0,
        "parity/native_worst_over_tol": 0.25,
        "calls/parity_forward": 5.0,
        "reload/max_abs_diff": 0.0,
        "time/step_ms": step_ms,
        "time/rmsnorm_ms": 0.5,
        "initial_weights_sha256": "0123456789abcdef",
        "seconds": 3.5,
        "ok": ok,
        "log_dir": "unused",
    }


def test_the_table_has_one_column_per_run_and_the_kernel_against_the_other_path():
    table = summary_table([row("reference_seed0", 0.125), row("triton_seed0", 0.0625, ok=False, step_ms=1.5)])
    assert markdown_rows(table) == [
        ["", "reference_seed0", "triton_seed0"],
        ["path", "reference", "triton"],
        ["backend", "cuda", "cuda"],
        ["steps", "100", "100"],
        ["train/mse", "0.5", "0.5"],
        ["val/mse", "0.25", "0.25"],
        ["test/mse", "0.125", "0.0625"],
        ["calls/forward", "100", "100"],
        ["calls/backward", "100", "100"],
        ["parity/initial_output_err", "1.25e-07", "1.25e-07"],
        ["parity/initial_grad_err", "0", "0"],
        ["parity/worst_over_tol", "0.5", "0.5"],
        ["parity/native_initial_output_err", "2.5e-07", "2.5e-07"],
        ["parity/native_initial_grad_err", "0", "0"],
        ["parity/native_worst_over_tol", "0.25", "0.25"],
        ["calls/parity_forward", "5", "5"],
        ["reload/max_abs_diff", "0", "0"],
        ["time/step_ms", "2", "1.5"],
        ["time/rmsnorm_ms", "0.5", "0.5"],
        ["initial_weights_sha256", "0123456789abcdef", "0123456789abcdef"],
        ["seconds", "3.5", "3.5"],
        ["ok", "True", "False"],
    ]
    assert table.splitlines()[-2:] == [
        "",
        "triton_seed0 against reference_seed0: median step 1.5 ms against 2 ms, 0.75x the time (faster); "
        "test/mse difference -0.0625",
    ]
    assert "against" not in summary_table([row("triton_seed0", 0.0625)])  # no other path to compare with


def test_the_table_of_three_paths_compares_the_kernel_with_each_other_path_of_its_configuration():
    rows = [
        row("reference_seed0", 0.125, step_ms=1.0, backend="interpreter"),
        row("native_seed0", 0.125, step_ms=0.5, backend="interpreter"),
        row("triton_seed0", 0.125, step_ms=25.0, backend="interpreter"),
        row("native_seed1", 0.25),  # a configuration without a kernel run: compared with nothing
    ]
    lines = summary_table(rows).splitlines()
    cells = markdown_rows(summary_table(rows))
    assert cells[0] == ["", "reference_seed0", "native_seed0", "triton_seed0", "native_seed1"]
    assert cells[1] == ["path", "reference", "native", "triton", "native"]
    interpreter = " (through Triton's interpreter on the CPU: these times say nothing of a GPU)"
    assert lines[-2:] == [
        "triton_seed0 against reference_seed0: median step 25 ms against 1 ms, 25x the time (not faster); "
        "test/mse difference 0" + interpreter,
        "triton_seed0 against native_seed0: median step 25 ms against 0.5 ms, 50x the time (not faster); "
        "test/mse difference 0" + interpreter,
    ]


def write_events(log_dir, scalars):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(log_dir))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def finished(r):
    return JobReturn(overrides=[f"norm={r.impl}"], status=JobStatus.COMPLETED, _return_value=r)


def runs_of(tmp_path, paths_and_test_mses):
    runs = []
    for impl, test_mse in paths_and_test_mses:
        log_dir = tmp_path / "runs" / f"{impl}_seed0" / "version_0"
        calls = 1.0 if impl == "triton" else 0.0
        write_events(
            log_dir,
            {
                "train/mse": [(0, 1.0), (1, 0.5)],
                "test/mse": [(2, test_mse)],
                "calls/forward": [(0, 0.0), (1, calls)],
                "reload/max_abs_diff": [(2, 0.0)],
            },
        )
        runs.append(result(impl, log_dir=str(log_dir), steps=2))
    return runs


@pytest.fixture
def two_runs(tmp_path):
    return runs_of(tmp_path, (("reference", 0.125), ("triton", 0.0625)))


def strict_json(name):
    raise ValueError(f"{name} is not standard JSON")


def run_callback(tmp_path, jobs):
    callback = MultirunSummary()
    for job in jobs:
        callback.on_job_end(None, job)
    callback.on_multirun_end(OmegaConf.create({"paths": {"runs": str(tmp_path / "runs")}}))


def test_after_a_multirun_the_table_is_read_back_from_the_event_files_and_written(tmp_path, two_runs, capsys):
    run_callback(tmp_path, [finished(r) for r in two_runs])
    (md,) = (tmp_path / "runs").glob("summary_*.md")
    report = json.loads(md.with_suffix(".json").read_text(), parse_constant=strict_json)  # standard JSON
    table = md.read_text()
    assert table.strip() in capsys.readouterr().out
    assert ["test/mse", "0.125", "0.0625"] in markdown_rows(table) and ["calls/forward", "0", "1"] in markdown_rows(
        table
    )
    assert "triton_seed0 against reference_seed0: median step not measured; test/mse difference -0.0625" in table
    rows = {r["run"]: r for r in report["runs"]}
    assert (rows["triton_seed0"]["train/mse"], rows["triton_seed0"]["steps"]) == (0.5, 2)
    assert rows["triton_seed0"]["val/mse"] is None  # never logged: null, rather than an invented number
    assert report["failures"] == [[], []] and report["crashed"] == []


def test_a_failed_check_ends_the_multirun_with_one_line(tmp_path, two_runs, capsys):
    two_runs[1].failures = ["integration: 0 Triton forward calls in 2 training steps on the triton path; expected 2"]
    with pytest.raises(SystemExit) as exit_:
        run_callback(tmp_path, [finished(r) for r in two_runs])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: 1 of 2 jobs failed; the first, job 1 (norm=triton): check failed: integration: 0 Triton forward "
        "calls in 2 training steps on the triton path; expected 2"
    )
    assert len(list((tmp_path / "runs").glob("summary_*.md"))) == 1  # the table is written first


def test_a_crashed_job_is_reported_after_the_others(tmp_path, two_runs, capsys):
    crashed = JobReturn(overrides=["norm=triton"], status=JobStatus.FAILED, _return_value=ValueError("boom"))
    with pytest.raises(SystemExit) as exit_:
        run_callback(tmp_path, [finished(two_runs[0]), crashed])
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    assert (
        err.strip().splitlines()[-1] == "train.py: 1 of 2 jobs failed; the first, job 1 (norm=triton): ValueError: boom"
    )
    assert out.splitlines()[-3:-1] == ["job 0 (norm=reference): OK", "job 1 (norm=triton): FAILED: ValueError: boom"]
    (js,) = (tmp_path / "runs").glob("summary_*.json")
    report = json.loads(js.read_text())
    assert [r["run"] for r in report["runs"]] == ["reference_seed0"]
    assert report["crashed"] == ["['norm=triton']: ValueError: boom"]
    assert [(j["job"], j["ok"], j["reason"]) for j in report["jobs"]] == [(0, True, ""), (1, False, "ValueError: boom")]


def test_in_a_multirun_a_refused_job_returns_its_reason_instead_of_exiting(tmp_path, capsys, monkeypatch):
    from rmsnorm_kernel.training import cli
    from tests.training.helpers import main

    multirun = SimpleNamespace(initialized=lambda: True, get=lambda: SimpleNamespace(mode=RunMode.MULTIRUN))
    monkeypatch.setattr(cli, "HydraConfig", multirun)
    result = main(tmp_path, "data.batch_size=0")  # no SystemExit: Hydra goes on with the next job
    assert not result.ok and result.stopped == "configuration error: data.batch_size is 0; accepted: an integer >= 1"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: configuration error: data.batch_size is 0; accepted: an integer >= 1"
    )


@pytest.mark.slow
def test_a_sweep_runs_every_job_lists_each_and_exits_1_when_one_failed(tmp_path):
    from rmsnorm_kernel.ops.contract import MAX_N
    from tests.helpers import train_process
    from tests.training.helpers import SCHEDULE

    proc = train_process(tmp_path, "-m", *SCHEDULE, f"model.hidden_dim={MAX_N + 1},128")
    assert proc.returncode == 1, proc.stderr[-3000:]
    refused = (
        f"training stopped: rmsnorm (triton): x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N} "
        "(norm.fallback=reference sends such inputs to the reference)"
    )
    assert proc.stderr.strip().splitlines()[-1] == (
        f"train.py: 1 of 2 jobs failed; the first, job 0 (model.hidden_dim={MAX_N + 1}): {refused}"
    )
    assert f"job 0 (model.hidden_dim={MAX_N + 1}): FAILED: {refused}" in proc.stdout
    assert "job 1 (model.hidden_dim=128): OK" in proc.stdout  # the job after the failed one ran
    assert ["", "triton_seed0_hidden128"] in markdown_rows(proc.stdout)
    assert (tmp_path / "checkpoints/triton_seed0_hidden128/version_0/final.ckpt").exists()
    (report,) = (tmp_path / "runs").glob("summary_*.json")
    assert [j["ok"] for j in json.loads(report.read_text())["jobs"]] == [False, True]


@pytest.mark.slow
def test_two_sweeps_started_together_get_their_own_hydra_folders(tmp_path):
    import subprocess
    import sys

    from tests.helpers import QUIET, ROOT
    from tests.training.helpers import SCHEDULE

    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *SCHEDULE, *QUIET, "norm=reference", "trainer.max_steps=1"]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    sweeps = list((tmp_path / "outputs/hydra/multirun").iterdir())
    assert len(sweeps) == 2 and all((s / "multirun.yaml").exists() for s in sweeps)
    assert len(list((tmp_path / "runs").glob("summary_*.md"))) == 2


def test_two_runs_of_one_name_get_columns_named_by_their_overrides(tmp_path, two_runs, capsys):
    # a value the run name leaves out (the batch size) tells them apart
    jobs = [
        JobReturn(
            overrides=["trainer.max_steps=2", f"data.batch_size={b}"],
            status=JobStatus.COMPLETED,
            _return_value=RunResult(**{**r.__dict__, "name": "triton_seed0"}),
        )
        for r, b in zip(two_runs, (16, 32))
    ]
    run_callback(tmp_path, jobs)
    out = capsys.readouterr().out
    assert ["", "triton_seed0 (data.batch_size=16)", "triton_seed0 (data.batch_size=32)"] in markdown_rows(out)
    assert "job 0 (data.batch_size=16): OK\njob 1 (data.batch_size=32): OK" in out


def test_after_a_three_path_multirun_the_table_and_the_jobs_list_every_path(tmp_path, capsys):
    order = ("reference", "native", "triton")  # the README's main command
    assert sorted(order) == sorted(IMPLS)
    run_callback(tmp_path, [finished(r) for r in runs_of(tmp_path, [(impl, 0.125) for impl in order])])
    out = capsys.readouterr().out
    cells = markdown_rows(out)
    assert ["", "reference_seed0", "native_seed0", "triton_seed0"] in cells
    assert ["path", "reference", "native", "triton"] in cells
    assert ["calls/forward", "0", "0", "1"] in cells
    for other in ("reference", "native"):
        assert f"triton_seed0 against {other}_seed0: median step not measured; test/mse difference 0" in out
    assert "job 0 (norm=reference): OK\njob 1 (norm=native): OK\njob 2 (norm=triton): OK" in out
    (js,) = (tmp_path / "runs").glob("summary_*.json")
    assert [(r["run"], r["path"]) for r in json.loads(js.read_text())["runs"]] == [(f"{p}_seed0", p) for p in order]


def test_the_table_of_language_model_runs_has_their_losses_and_tokens_per_second():
    def lm_row(name, tokens_per_s):
        r = {k: v for k, v in row(name, 0.0).items() if not k.endswith("/mse")}
        return {
            **r,
            "loss_name": "loss",
            "train/loss": 3.5,
            "val/loss": 3.25,
            "test/loss": 3.0,
            "time/tokens_per_s": tokens_per_s,
        }

    lines = summary_table([lm_row("reference_seed0_transformer", 1000.0), lm_row("triton_seed0_transformer", 2000.0)])
    rows = markdown_rows(lines)[1:]  # the header left out
    names = [r[0] for r in rows]
    assert names[3:6] == ["train/loss", "val/loss", "test/loss"] and "train/mse" not in names
    assert ["time/tokens_per_s", "1000", "2000"] in rows
    assert "time/tokens_per_s" not in summary_table([row("reference_seed0", 0.125)])
