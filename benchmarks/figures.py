"""The benchmark's figure, drawn from its ``benchmark.json``: per mode (forward, forward+backward),
bandwidth in TB/s against the copy ceiling and time per call, one bar per implementation for each shape
and dtype.

``benchmark_figure`` reads the file defensively (a list of flat records, at the top or under one key) and
returns a ``FigureResult``: ``skipped`` when the file is absent or has no timings (a run without a GPU),
``failed`` when it is unusable, never an exception. ``is_number`` serves the sweep's figure too
(``sweep.figures``); ``pyplot`` and ``FigureResult`` come from the package's figures.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rmsnorm_kernel.checks.figures import FigureResult, pyplot

#: The figure's file name, under ``<outputs>/figures`` (the name ``clean`` removes).
FIGURE = "benchmark.png"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_X_KEYS = ("N", "n", "hidden", "hidden_dim", "cols", "size")
_MEASURE = re.compile(r"(ms|_us|time|sec|gb|bandwidth|throughput|speed|tflops|flops)", re.I)


def _records(data) -> list[dict]:
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return data
    if isinstance(data, dict):
        for key in ("results", "records", "rows", "cases", "measurements", "data"):
            if key in data:
                found = _records(data[key])
                if found:
                    return found
        for value in data.values():
            if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
                return value
    return []


_BAR_MEASURES = (
    ("bandwidth_tbps", "bandwidth (TB/s), higher is better"),
    ("events_us", "time per call (us), lower is better"),
)


def _bar_figure(records: list[dict], data: dict, path: Path, out: Path) -> FigureResult:
    """One panel per (mode, measure): bars per implementation over the shapes, as benchmark.py writes them."""
    measures = [(k, t) for k, t in _BAR_MEASURES if any(is_number(r.get(k)) for r in records)]
    modes = sorted({str(r["mode"]) for r in records})
    impls = sorted({str(r["impl"]) for r in records}, key=lambda i: (i != "triton", i))

    def case(r: dict) -> str:
        return " ".join(str(r[k]) for k in ("shape", "dtype") if k in r) or "all"

    def size(r: dict) -> float:
        m, n = r.get("M"), r.get("N")
        return m * n if is_number(m) and is_number(n) else 0

    plt = pyplot()
    fig, axes = plt.subplots(len(modes), len(measures), figsize=(7 * len(measures), 3.8 * len(modes)), squeeze=False)
    series, failed = [], 0
    for row, mode in enumerate(modes):
        of_mode = [r for r in records if str(r["mode"]) == mode]
        cases = sorted({case(r) for r in of_mode}, key=lambda c: min(size(r) for r in of_mode if case(r) == c))
        width = 0.8 / max(len(impls), 1)
        for col, (key, title) in enumerate(measures):
            ax = axes[row][col]
            for i, impl in enumerate(impls):
                xs, ys = [], []
                for j, c in enumerate(cases):
                    hit = [r for r in of_mode if r["impl"] == impl and case(r) == c and is_number(r.get(key))]
                    if hit and hit[0].get("ok", True) is not False:
                        xs.append(j + (i - (len(impls) - 1) / 2) * width)
                        ys.append(hit[0][key])
                    elif hit:
                        failed += 1  # a wrong result is no timing to compare
                if xs:
                    ax.bar(xs, ys, width=width, label=impl)
                    series.append(f"{mode} {key} {impl}")
            ceiling = data.get("ceiling_tbps") if isinstance(data, dict) else None
            if key == "bandwidth_tbps" and is_number(ceiling):
                ax.axhline(ceiling, color="black", linestyle=":", linewidth=1, label="copy ceiling")
            ax.set_xticks(range(len(cases)), cases, rotation=30, ha="right", fontsize=7)
            ax.set_title(f"{mode}: {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(
        f"Benchmark ({path.name}"
        + (f", {data.get('device')}" if isinstance(data, dict) and data.get("device") else "")
        + ")"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    detail = f"{len(records)} records; panels: {', '.join(m for m in modes)} x {', '.join(k for k, _ in measures)}"
    if failed:
        detail += f"; {failed} bar(s) left out because the result was wrong"
    return FigureResult(out.name, "written", detail, str(out), series)


def benchmark_figure(benchmark_json: Path, out: Path) -> FigureResult:
    name = out.name
    path = Path(benchmark_json)
    if not path.is_file():
        return FigureResult(name, "skipped", f"no {path} (run python -m benchmarks.benchmark first)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return FigureResult(name, "failed", f"{path} is not readable JSON ({type(exc).__name__}: {exc})")
    records = _records(data)
    if not records:
        return FigureResult(
            name,
            "failed",
            f"{path} holds no list of result records; accepted: a list of objects, at the top or under 'results'",
        )
    if (
        isinstance(data, dict)
        and data.get("timed") is False
        or not any(is_number(v) for r in records for k, v in r.items() if _MEASURE.search(k))
    ):
        return FigureResult(name, "skipped", f"{path} has no timings (written without a GPU: a correctness-only run)")
    if all("impl" in r and "mode" in r for r in records) and any(
        is_number(r.get(k)) for r in records for k, _ in _BAR_MEASURES
    ):
        return _bar_figure(records, data, path, out)
    x_key = next((k for k in _X_KEYS if all(is_number(r.get(k)) for r in records)), None)
    if x_key is None:
        return FigureResult(
            name, "failed", f"{path}: no numeric row-length field in every record; looked for {', '.join(_X_KEYS)}"
        )
    numeric = sorted({k for r in records for k, v in r.items() if k != x_key and is_number(v)})
    measures = ([k for k in numeric if _MEASURE.search(k)] or numeric)[:6]
    if not measures:
        return FigureResult(name, "failed", f"{path}: no numeric measurement besides {x_key}")

    def variant(r: dict) -> str:
        parts = [
            f"{k}={v}"
            for k, v in sorted(r.items())
            if k not in (x_key, *measures) and isinstance(v, (str, int)) and not isinstance(v, bool)
        ]
        return " ".join(parts) or "all"

    plt = pyplot()
    fig, axes = plt.subplots(1, len(measures), figsize=(5.5 * len(measures), 4.2), squeeze=False)
    series = []
    for ax, m in zip(axes[0], measures):
        groups: dict[str, list[tuple[float, float]]] = {}
        for r in records:
            if is_number(r.get(m)):
                groups.setdefault(variant(r), []).append((r[x_key], r[m]))
        for label, pts in sorted(groups.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", markersize=3, label=label)
            series.append(f"{m}: {label}")
        ax.set_xlabel(x_key)
        ax.set_ylabel(m)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"Benchmark ({path.name})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return FigureResult(
        name, "written", f"{len(records)} records, x = {x_key}, panels: {', '.join(measures)}", str(out), series
    )
