"""What a run reports: the printed summary of one run, and the side-by-side table after ``train.py -m``."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import asdict

from hydra.experimental.callback import Callback as HydraCallback

from ..jsonio import write_json
from ..tables import table
from .events import read_scalars
from .parity import COMPARED, KERNEL, ORACLE, parity_tag
from .paths import project_path
from .result import RunResult

#: Each compared path's parity numbers in the multirun table: (name, how the run's values are read back).
PARITY_ROWS = (("initial_output_err", "last"), ("initial_grad_err", "last"), ("worst_over_tol", "largest"))

#: The rows of the multirun table, in order; each run is a column. ``LOSS_ROWS`` stand for the loss of each
#: split, named after the runs' loss (``train/mse`` for the regression, ``train/loss`` for the language model).
LOSS_ROWS = ("train/{}", "val/{}", "test/{}")
TABLE_KEYS = (
    "path",
    "backend",
    "steps",
    *LOSS_ROWS,
    "calls/forward",
    "calls/backward",
    *(parity_tag(path, name) for path in COMPARED for name, _ in PARITY_ROWS),
    "calls/parity_forward",
    "reload/max_abs_diff",
    "time/step_ms",
    "time/tokens_per_s",
    "time/rmsnorm_ms",
    "initial_weights_sha256",
    "seconds",
    "ok",
)


def format_summary(r: RunResult) -> str:
    """One run's summary, printed by ``train.py``.

    Every verdict and count covers the run's whole history: a resumed run reports what its checkpoint
    carried (the parity checks, the call counts) with what it saw itself, and a verdict its checkpoint
    did not carry is ``unknown``, never passed. Under data parallelism the losses and the parity
    differences are those of the global batch, as TensorBoard has them; the Triton call counts are per
    process (each process counts its own calls): process 0's, as TensorBoard's ``calls/*``.
    """
    m = r.metrics
    norm_ms = m.get("time/rmsnorm_ms", math.nan)  # measured on a GPU only
    step_ms = m.get("time/step_ms", math.nan)
    lines = [
        f"run {r.name}: {'OK' if r.ok else 'FAILED'}",
        f"  path {r.impl}, backend {r.backend}, {r.steps} steps, {r.seconds:.1f} s, "
        f"median step {step_ms:.3g} ms"
        + (
            ""
            if math.isnan(norm_ms)
            else f" (RMSNorm layers {norm_ms:.3g} ms of it, {norm_ms / step_ms:.0%}, GPU time)"
        )
        + (f", {m['time/tokens_per_s']:.4g} tokens/s" if "time/tokens_per_s" in m else ""),
        f"  {r.loss_name}: "
        + ", ".join(f"{s} {m.get(f'{s}/{r.loss_name}', float('nan')):.6f}" for s in ("train", "val", "test"))
        + (f"; perplexity: test {m['test/ppl']:.4g}" if "test/ppl" in m else ""),
        f"  Triton calls per process (process 0's, as TensorBoard's calls/*): train forward "
        f"{r.calls.get('train/forward')}, backward {r.calls.get('train/backward')}; "
        f"val forward {r.calls.get('val/forward')}, test forward {r.calls.get('test/forward')}; "
        f"training fallbacks to the reference {r.calls.get('train/fallback')}",
        *parity_lines(r),
        f"  reload parity: max |diff| {m.get('reload/max_abs_diff')} "
        f"({'bit-identical' if m.get('reload/max_abs_diff') == 0 else 'DIFFERENT'})",
        *([f"  branched from {r.branched_from}"] if r.branched_from else []),
        f"  logs: {r.log_dir}",
        f"  checkpoint: {r.checkpoint}",
    ]
    lines += [f"  check failed: {f}" for f in r.failures]
    return "\n".join(lines)


def parity_lines(r: RunResult) -> list[str]:
    """The summary's parity lines: each compared path's initial check, then the checks along the run."""
    m = r.metrics
    if r.parity_skipped:
        return [
            f"  initial parity: skipped: {r.parity_skipped}",
            "  parity along the run: skipped (the Triton contract refuses this shape)",
        ]
    known = [path for path in COMPARED if m.get(parity_tag(path, "initial_output_err")) is not None]
    lines = []
    if not known:
        lines.append("  initial parity: unknown: the checkpoint this run resumed from carries no parity verdicts")
    for path in COMPARED:
        head = f"  initial parity (step 0), {path} against the {ORACLE}:"
        if path not in known:
            if known:
                lines.append(f"{head} unknown: the checkpoint this run resumed from carries no verdicts of {path}")
            continue
        failed = any(f.startswith(f"initial parity: {path} ") for f in r.failures)
        output_err, grad_err = m[parity_tag(path, "initial_output_err")], m[parity_tag(path, "initial_grad_err")]
        lines.append(
            f"{head} output {output_err:.3g}, grad {grad_err:.3g}: "
            + ("FAILED (beyond the tolerance)" if failed else "within the tolerance")
        )
    worst = ", ".join(f"{m.get(parity_tag(path, 'worst_over_tol'), math.nan):.3g} ({path})" for path in COMPARED)
    lines.append(
        f"  parity along the run: {int(m.get('parity/checks', 0))} checks over the run's history, worst "
        f"difference {worst} of the tolerance; their Triton calls: forward {r.calls.get('parity/forward')}, "
        f"backward {r.calls.get('parity/backward')}"
    )
    layers = [
        f"{r.norm_worst_layers[path]} {m[parity_tag(path, 'norm_worst_over_tol')]:.3g} ({path})"
        for path in COMPARED
        if path in r.norm_worst_layers
    ]
    if layers:
        lines.append(f"  worst norm layer, of the tolerance: {', '.join(layers)}")
    return lines


def _missing(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def summary_table(rows: list[dict]) -> str:
    """Runs side by side, one column per run, then the kernel's runs against the other paths' (``comparisons``)."""

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    names = list(dict.fromkeys(r["loss_name"] for r in rows))  # the losses of these runs, in their order
    keys = [k.format(name) for k in TABLE_KEYS for name in (names if k in LOSS_ROWS else [None])]
    # the regression's runs log no tokens per second: that row only where a run has it
    keys = [k for k in keys if k != "time/tokens_per_s" or any(not _missing(r.get(k, math.nan)) for r in rows)]
    body = [[k] + [fmt(r.get(k, math.nan)) for r in rows] for k in keys]
    lines = [table(["", *(r["run"] for r in rows)], body, markdown=True)]
    against = comparisons(rows)
    if against:
        lines += ["", *against]
    return "\n".join(lines)


def comparisons(rows: list[dict]) -> list[str]:
    """Each run of the kernel against the run of every other path with the same configuration (the same
    run name but for its path): the median step times, and the test loss difference, one line each, for a
    reader who wants to know whether the kernel beats the path they would otherwise use. Nothing for a
    configuration without a kernel run, or with two runs of one path."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        groups.setdefault(row["name"].removeprefix(f"{row['path']}_"), {}).setdefault(row["path"], []).append(row)
    lines = []
    for by_path in groups.values():
        if KERNEL not in by_path or any(len(runs) > 1 for runs in by_path.values()):
            continue
        (kernel,) = by_path[KERNEL]
        for path, (other,) in by_path.items():
            if path == KERNEL:
                continue
            a, b = kernel["time/step_ms"], other["time/step_ms"]
            if math.isnan(a) or math.isnan(b):
                speed = "not measured"
            else:
                speed = f"{a:.3g} ms against {b:.3g} ms, {a / b:.2g}x the time ({'faster' if a < b else 'not faster'})"
            test = f"test/{kernel['loss_name']}"
            line = (
                f"{kernel['run']} against {other['run']}: median step {speed}; "
                f"{test} difference {kernel[test] - other.get(test, math.nan):.3g}"
            )
            if "interpreter" in (kernel["backend"], other["backend"]):
                line += " (through Triton's interpreter on the CPU: these times say nothing of a GPU)"
            lines.append(line)
    return lines


def last(scalars: dict, tag: str) -> float:
    return scalars[tag][-1][1] if scalars.get(tag) else float("nan")


def largest(scalars: dict, tag: str) -> float:
    return max(v for _, v in scalars[tag]) if scalars.get(tag) else float("nan")


def median(scalars: dict, tag: str) -> float:
    return statistics.median(v for _, v in scalars[tag]) if scalars.get(tag) else float("nan")


def table_row(r: RunResult) -> dict:
    """One run's column of the table, its values read back from its TensorBoard event files."""
    s = read_scalars(r.log_dir)
    read = {"last": last, "largest": largest}  # the worst ratio to the tolerance over the run: <= 1 passes
    parity = {
        parity_tag(path, name): read[how](s, parity_tag(path, name)) for path in COMPARED for name, how in PARITY_ROWS
    }
    return {
        "run": r.name,
        "name": r.name,
        "path": r.impl,
        "backend": r.backend,
        "steps": r.steps,
        "loss_name": r.loss_name,
        **{row.format(r.loss_name): last(s, row.format(r.loss_name)) for row in LOSS_ROWS},
        "calls/forward": last(s, "calls/forward"),
        "calls/backward": last(s, "calls/backward"),
        **parity,
        "calls/parity_forward": last(s, "calls/parity_forward"),
        "reload/max_abs_diff": last(s, "reload/max_abs_diff"),
        "time/step_ms": median(s, "time/step_ms"),  # the median of the windows' medians
        "time/tokens_per_s": median(s, "time/tokens_per_s"),  # the language model's; nan for the regression
        "time/rmsnorm_ms": median(s, "time/rmsnorm_ms"),  # nan where not measured (CPU, compile=true)
        "initial_weights_sha256": r.initial_weights_sha256[:16],
        "seconds": round(r.seconds, 1),
        "ok": r.ok,
        "log_dir": r.log_dir,
    }


class MultirunSummary(HydraCallback):
    """After ``train.py -m``: one table of the runs that finished, then one line per job (its overrides,
    and OK or the one-line reason it failed), printed and written to ``paths.runs``; exits 1 with one line
    when a job failed (a failed check, a refused configuration, a crash). A failed job does not stop
    the others (``cli.JobFailed``)."""

    def __init__(self) -> None:
        self.results: list[RunResult] = []
        self.crashed: list[str] = []
        self.jobs: list[dict] = []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        job = {"job": len(self.jobs), "overrides": list(job_return.overrides or [])}
        try:
            r = job_return.return_value
        except Exception as e:  # the job raised: keep going, report it at the end
            reason = str(e) if type(e).__name__ == "JobFailed" else f"{type(e).__name__}: {e}"
            reason = reason.strip().splitlines()[0] if reason.strip() else type(e).__name__
            self.crashed.append(f"{job_return.overrides}: {reason}")
            job.update(run=None, ok=False, reason=reason)
        else:
            if r.stopped:  # stopped before its end: no logs to read back
                job.update(run=None, ok=False, reason=r.stopped)
            else:
                self.results.append(r)
                reason = f"check failed: {r.failures[0]}" if r.failures else r.nothing_to_do
                job.update(run=r.name, ok=r.ok, reason=reason)
        self.jobs.append(job)

    def on_multirun_end(self, config, **kwargs) -> None:
        # each job is named by the overrides that tell it from the others (all of them for a single job)
        common = set.intersection(*(set(j["overrides"]) for j in self.jobs)) if len(self.jobs) > 1 else set()
        for j in self.jobs:
            j["overrides"] = " ".join(o for o in j["overrides"] if o not in common)
        rows = [table_row(r) for r in self.results]
        names = [row["run"] for row in rows]
        finished = [j for j in self.jobs if j["run"] is not None]
        for row, job in zip(rows, finished):
            if names.count(row["run"]) > 1:  # runs of one name differ in a value the name leaves out
                row["run"] = f"{row['run']} ({job['overrides']})"
        table = summary_table(rows) if rows else "(no run finished)"
        jobs = "\n".join(
            f"job {j['job']} ({j['overrides']}): {'OK' if j['ok'] else 'FAILED'}"
            + (f": {j['reason']}" if j["reason"] else "")
            for j in self.jobs
        )
        text = f"{table}\n\n{jobs}"
        print("\n" + text, flush=True)
        out_dir = project_path(config.paths.runs)
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}"  # two sweeps never share a file
        (out_dir / f"summary_{stamp}.md").write_text(text + "\n")
        report = {
            "runs": rows,
            "failures": [asdict(r)["failures"] for r in self.results],
            "crashed": self.crashed,
            "jobs": self.jobs,
        }
        # a metric that is not measured here (NaN: the RMSNorm GPU time on the CPU) is null: JSON has no NaN
        write_json(out_dir / f"summary_{stamp}.json", report)
        print(f"summary written to {out_dir / f'summary_{stamp}.md'}", flush=True)
        failed = [j for j in self.jobs if not j["ok"]]
        if failed:
            first = failed[0]
            print(
                f"train.py: {len(failed)} of {len(self.jobs)} jobs failed; the first, job {first['job']} "
                f"({first['overrides']}): {first['reason']}",
                file=sys.stderr,
            )
            sys.exit(1)
