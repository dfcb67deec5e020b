"""What a run reports: the printed summary of one run, and the side-by-side table after ``train.py -m``."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from hydra.experimental.callback import Callback as HydraCallback

from .events import read_scalars
from .paths import project_path
from .run import RunResult

#: The rows of the multirun table, in order; each run is a column.
TABLE_KEYS = (
    "backend", "steps", "train/mse", "val/mse", "test/mse", "calls/forward", "calls/backward",
    "parity/initial_output_err", "parity/initial_grad_err", "reload/max_abs_diff", "initial_weights_sha256",
    "seconds", "ok",
)


def format_summary(r: RunResult) -> str:
    m = r.metrics
    lines = [
        f"run {r.name}: {'OK' if r.ok else 'FAILED'}",
        f"  path {r.impl}, backend {r.backend}, {r.steps} steps, {r.seconds:.1f} s",
        f"  mse: train {m.get('train/mse', float('nan')):.6f}, val {m.get('val/mse', float('nan')):.6f}, "
        f"test {m.get('test/mse', float('nan')):.6f}",
        f"  Triton calls: train forward {r.calls.get('train/forward')}, backward {r.calls.get('train/backward')}; "
        f"val forward {r.calls.get('val/forward')}, test forward {r.calls.get('test/forward')}; "
        f"training fallbacks to the reference {r.calls.get('train/fallback')} (counts of process 0)",
        (
            f"  initial parity: skipped: {r.parity_skipped}"
            if r.parity_skipped
            else f"  initial parity: output {m['parity/initial_output_err']:.3g}, grad {m['parity/initial_grad_err']:.3g}"
            if m.get("parity/initial_output_err") is not None
            else "  initial parity: measured at step 0 by the run this one resumed"
        ),
        f"  reload parity: max |diff| {m.get('reload/max_abs_diff')} "
        f"({'bit-identical' if m.get('reload/max_abs_diff') == 0 else 'DIFFERENT'})",
        *([f"  branched from {r.branched_from}"] if r.branched_from else []),
        f"  logs: {r.log_dir}",
        f"  checkpoint: {r.checkpoint}",
    ]
    lines += [f"  check failed: {f}" for f in r.failures]
    return "\n".join(lines)


def summary_table(rows: list[dict]) -> str:
    """Runs side by side, one column per run, with the test-MSE difference when there are two."""

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    header = "| | " + " | ".join(r["run"] for r in rows) + " |"
    lines = [header, "|---" * (len(rows) + 1) + "|"]
    lines += ["| " + k + " | " + " | ".join(fmt(r[k]) for r in rows) + " |" for k in TABLE_KEYS]
    if len(rows) == 2:
        lines.append(
            f"\ntest/mse difference ({rows[0]['run']} - {rows[1]['run']}): "
            f"{rows[0]['test/mse'] - rows[1]['test/mse']:.3g}"
        )
    return "\n".join(lines)


def last(scalars: dict, tag: str) -> float:
    return scalars[tag][-1][1] if scalars.get(tag) else float("nan")


def table_row(r: RunResult) -> dict:
    """One run's column of the table, its values read back from its TensorBoard event files."""
    s = read_scalars(r.log_dir)
    return {
        "run": r.name,
        "backend": r.backend,
        "steps": r.steps,
        "train/mse": last(s, "train/mse"),
        "val/mse": last(s, "val/mse"),
        "test/mse": last(s, "test/mse"),
        "calls/forward": last(s, "calls/forward"),
        "calls/backward": last(s, "calls/backward"),
        "parity/initial_output_err": last(s, "parity/initial_output_err"),
        "parity/initial_grad_err": last(s, "parity/initial_grad_err"),
        "reload/max_abs_diff": last(s, "reload/max_abs_diff"),
        "initial_weights_sha256": r.initial_weights_sha256[:16],
        "seconds": round(r.seconds, 1),
        "ok": r.ok,
        "log_dir": r.log_dir,
    }


class MultirunSummary(HydraCallback):
    """After ``train.py -m``, one table of all runs, printed and written to ``paths.runs``; exits 1 with
    one line when a run failed a check or crashed."""

    def __init__(self) -> None:
        self.results: list[RunResult] = []
        self.crashed: list[str] = []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        try:
            self.results.append(job_return.return_value)
        except Exception as e:  # the job raised: keep going, report it at the end
            self.crashed.append(f"{job_return.overrides}: {type(e).__name__}: {e}")

    def on_multirun_end(self, config, **kwargs) -> None:
        rows = [table_row(r) for r in self.results]
        table = summary_table(rows)
        print("\n" + table, flush=True)
        out_dir = project_path(config.paths.runs)
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        (out_dir / f"summary_{stamp}.md").write_text(table + "\n")
        report = {"runs": rows, "failures": [asdict(r)["failures"] for r in self.results], "crashed": self.crashed}
        (out_dir / f"summary_{stamp}.json").write_text(json.dumps(report, indent=2))
        print(f"summary written to {out_dir / f'summary_{stamp}.md'}", flush=True)
        failures = [f"{r.name}: {f}" for r in self.results for f in r.failures] + self.crashed
        if failures:
            print(f"train.py: check failed: {failures[0]}", file=sys.stderr)
            sys.exit(1)
