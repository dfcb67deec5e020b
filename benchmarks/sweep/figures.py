"""The sweep's figure: bandwidth from GPU time against the hidden size N.

One line per implementation (bfloat16; float16 and float32 as open triangles and squares), forward and
forward + backward, one panel per regime (large: 512 MiB, mid: 32 MiB) and one for the shapes outside the
sweep, with each regime's copy ceiling. Drawn from the merged ``benchmark-sweep.json`` by ``--merge``, and
from a results file's merged runs by ``--report``; skipped when the file is absent or has no timings.
"""

from __future__ import annotations

import json
from pathlib import Path

from rmsnorm_kernel.checks.figures import FigureResult, pyplot

from ..figures import is_number
from .measure import best_ceilings
from .report import MERGED_KIND
from .results import RUN_KIND

FIGURE = "benchmark_sweep.png"

SWEEP_COLORS = {
    "triton": "tab:red",
    "compile": "tab:blue",
    "F.rms_norm": "tab:green",
    "liger": "tab:purple",
    "reference": "tab:gray",
    "seed": "tab:olive",
}
SWEEP_MARKERS = {"bfloat16": "o", "float16": "^", "float32": "s"}
SWEEP_PANELS = (
    ("large", "sweep", "large regime (x of 512 MiB)"),
    ("mid", "sweep", "mid regime (x of 32 MiB)"),
    ("large", "outside", "outside the sweep (large regime)"),
    ("act128", "narrow", "narrow rows (x of 128 MiB)"),
    ("act256", "activation", "activation-sized (x of 256 MiB)"),
)


def sweep_figure(sweep_json: Path | dict, out: Path) -> FigureResult:
    """TB/s (GPU time) against N: rows are directions, columns the regimes and the outside shapes.
    ``sweep_json``: the merged file, or the merged runs themselves (``report.merge``)."""
    name = out.name
    given = sweep_json if isinstance(sweep_json, dict) else None
    path = Path("the merged runs") if given is not None else Path(sweep_json)
    if given is None and not path.is_file():
        return FigureResult(name, "skipped", f"no {path} (run python -m benchmarks.sweep on a GPU, then --merge)")
    try:
        data = given if given is not None else json.loads(path.read_text())
        rows = data["rows"]
        if data.get("kind") not in (MERGED_KIND, RUN_KIND) or not isinstance(rows, list):
            raise ValueError("not written by the sweep")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return FigureResult(name, "failed", f"{path} is not a sweep file ({type(exc).__name__}: {exc})")
    timed = [r for r in rows if r.get("ok") and is_number(r.get("gpu_tbps")) and r.get("repeat", 0) == 0]
    if not timed:
        return FigureResult(name, "skipped", f"{path} has no timings (runs without a GPU: correctness only)")
    panels = [p for p in SWEEP_PANELS if any(r["regime"] == p[0] and r.get("origin") == p[1] for r in timed)]
    if not panels:  # the tiny points (and the benchmark's small shapes) are in the report, not in the figure
        return FigureResult(name, "skipped", f"{path} has no timed row of the large or mid regime")
    modes = [m for m in ("fwd", "fwd+bwd") if any(r["mode"] == m for r in timed)]
    ceilings = best_ceilings(data.get("ceilings", []))  # the report's rule
    impls = sorted(
        {r["impl"] for r in timed}, key=lambda i: (list(SWEEP_COLORS).index(i) if i in SWEEP_COLORS else 99, i)
    )

    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(len(modes), len(panels), figsize=(6.2 * len(panels), 4.2 * len(modes)), squeeze=False)
    series = []
    for i, mode in enumerate(modes):
        for j, (regime, origin, title) in enumerate(panels):
            ax = axes[i][j]
            here = [r for r in timed if r["mode"] == mode and r["regime"] == regime and r.get("origin") == origin]
            for impl in impls:
                color = SWEEP_COLORS.get(impl)
                for dtype, marker in SWEEP_MARKERS.items():
                    pts = sorted((r["N"], r["gpu_tbps"]) for r in here if r["impl"] == impl and r["dtype"] == dtype)
                    if not pts:
                        continue
                    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                    if dtype == "bfloat16" and origin == "sweep":
                        ax.plot(
                            xs,
                            ys,
                            "-",
                            marker=marker,
                            markersize=3,
                            linewidth=1.8 if impl == "triton" else 1.1,
                            color=color,
                        )
                    else:
                        ax.plot(
                            xs, ys, linestyle="none", marker=marker, markersize=5, color=color, markerfacecolor="none"
                        )
                    series.append(f"{mode} {regime}/{origin} {impl} {dtype}")
            if regime in ceilings:
                ax.axhline(ceilings[regime], color="black", linestyle=":", linewidth=1)
            if origin == "outside":
                ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{mode}: {title}", fontsize=9)
            ax.set_xlabel("hidden size N")
            ax.set_ylabel("TB/s (GPU time)")
            ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=SWEEP_COLORS.get(i), label=i) for i in impls]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            linestyle="none",
            marker=m,
            markerfacecolor="none" if d != "bfloat16" else "black",
            label=d,
        )
        for d, m in SWEEP_MARKERS.items()
    ]
    handles.append(Line2D([], [], color="black", linestyle=":", label="copy ceiling"))
    axes[0][0].legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle(
        f"Sweep: bandwidth from GPU time (CUDA-graph replays) against N, {data.get('device', '')}; "
        f"bfloat16 lines, float16 and float32 open markers",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return FigureResult(
        name,
        "written",
        f"{len(timed)} timed rows; panels: {', '.join(m for m in modes)} x {', '.join(p[2] for p in panels)}",
        str(out),
        series,
    )
