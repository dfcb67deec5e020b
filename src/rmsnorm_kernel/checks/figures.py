"""PNG figures from what the check commands and the training runs wrote.

Each figure function reads its inputs, draws one PNG with matplotlib's Agg backend (no display needed)
and returns a ``FigureResult``; missing or unreadable inputs give a ``skipped`` or ``failed`` result
with the reason, never an exception. ``pyplot`` and ``FigureResult`` serve the figures of the
repository's ``benchmarks`` too, which draw their own.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..ops.impls import IMPLS

#: What each figure shows, for ``--help`` and the report.
FIGURES: dict[str, str] = {
    "training_mse.png": (
        "train/mse and val/mse over the training steps, one line per run under runs/ (reference path "
        "solid, native path dotted, Triton path dashed): if the kernel is a drop-in replacement the "
        "paths' curves lie on top of each other"
    ),
    "training_loss.png": (
        "the language model's (model=transformer) train/loss and val/loss over the training steps, drawn as "
        "training_mse.png draws the regression's"
    ),
    "check_errors.png": (
        "for each check campaign (check-forward: y, check-backward: dx, check-gamma: dgamma), the max "
        "absolute and max relative error of every case, per dtype, on a log scale, with the declared "
        "atol of each dtype as a bar; failed cases are red crosses"
    ),
}

#: Each training figure: its tags (the first two: the curves it draws) and what they measure. The
#: regression logs the MSE, the language model the cross-entropy per byte (``network.LOSS_NAMES``).
TRAINING_FIGURES = {
    "training_mse.png": (("train/mse", "val/mse"), "MSE"),
    "training_loss.png": (("train/loss", "val/loss"), "cross-entropy per byte (nats)"),
}
#: How each path's curves are drawn: (line style, width, opacity). The runs of one configuration share a
#: colour, so that identical curves show as one striped line: the reference wide and faint, native dotted
#: over it, Triton thin dashes on top.
PATH_STYLES = {"reference": ("-", 3.0, 0.6), "native": (":", 2.2, 0.8), "triton": ("--", 1.3, 1.0)}
#: Errors of exactly 0 cannot sit on a log axis; they are drawn at this height.
ZERO_FLOOR = 1e-12


@dataclass
class FigureResult:
    name: str
    status: str  # "written", "skipped" (inputs absent) or "failed" (inputs present but unusable)
    detail: str
    path: str = ""
    series: list[str] = field(default_factory=list)


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------------------------------
# Training curves


def _words(label: str) -> list[str]:
    """A run directory's name in words: ``triton_seed0/version_0`` is triton, seed0, version, 0."""
    return re.split(r"[^a-z0-9]+", label.lower())


def run_path(label: str) -> str | None:
    """Which path (``impls.IMPLS``) a run directory's name says it trained, by a word of it (the training
    names runs ``<path>_seed<n>...``), or None when it names none or several."""
    found = [p for p in IMPLS if p in _words(label)]
    return found[0] if len(found) == 1 else None


def _pair_key(label: str) -> str:
    """The run's name with its path left out: the runs of one configuration share it."""
    return "_".join("*" if word in IMPLS else word for word in _words(label))


def read_training_scalars(
    runs_dir: Path, tags: tuple[str, ...] = TRAINING_FIGURES["training_mse.png"][0]
) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{run label: {tag: (steps, values)}} of ``tags`` for every directory under ``runs_dir`` holding
    event files.

    The label is the directory's path relative to ``runs_dir`` (e.g. ``triton_seed0/version_0``).
    """
    from ..training.events import read_scalars

    runs: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    event_dirs = sorted({p.parent for p in Path(runs_dir).rglob("events.out.tfevents*") if p.is_file()})
    for d in event_dirs:
        every = read_scalars(d)
        scalars = {tag: ([s for s, _ in every[tag]], [v for _, v in every[tag]]) for tag in tags if tag in every}
        runs[str(d.relative_to(runs_dir))] = scalars
    return runs


def training_figure(runs_dir: Path, out: Path, kind: str = "training_mse.png") -> FigureResult:
    """The training curves of ``TRAINING_FIGURES[kind]`` of every run under ``runs_dir`` that logged them."""
    name = out.name
    tags, quantity = TRAINING_FIGURES[kind]
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return FigureResult(name, "skipped", f"no {runs_dir}/ directory: run train.py first")
    try:
        runs = read_training_scalars(runs_dir, tags)
    except Exception as exc:
        return FigureResult(
            name, "failed", f"could not read the event files under {runs_dir}: {type(exc).__name__}: {exc}"
        )
    if not runs:
        return FigureResult(name, "skipped", f"no TensorBoard event files under {runs_dir}/")
    usable = {label: s for label, s in runs.items() if s}
    # the regression's runs and the language model's log different losses: each has its own figure
    notes = [
        f"{label}: no {' or '.join(tags)} scalars (a run of the other kind of network: not drawn here)"
        for label, s in runs.items()
        if not s
    ]
    if not usable:
        return FigureResult(name, "skipped", "; ".join(notes))
    paths_seen = {run_path(label) for label in usable}
    for p in IMPLS:
        if p not in paths_seen:
            notes.append(
                f"no run of the {p} path among these runs (a run directory's name must contain one of "
                f"{', '.join(IMPLS)})"
            )

    plt = pyplot()
    fig, axes = plt.subplots(1, len(tags), figsize=(12, 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # The paths of one configuration (same seed...) share a colour; each path has its style (PATH_STYLES).
    pairs = sorted({_pair_key(label) for label in usable})
    series = []
    for ax, tag in zip(axes[0], tags):
        for label, scalars in sorted(usable.items()):
            if tag not in scalars:
                continue
            steps, values = scalars[tag]
            style, width, alpha = PATH_STYLES.get(run_path(label), PATH_STYLES["reference"])
            ax.plot(
                steps,
                values,
                style,
                linewidth=width,
                alpha=alpha,
                marker="o" if len(steps) < 30 else None,
                markersize=3,
                color=colors[pairs.index(_pair_key(label)) % len(colors)],
                label=label,
            )
            series.append(f"{label} {tag}")
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.set_ylabel(quantity)
        if all(v > 0 for s in usable.values() if tag in s for v in s[tag][1]):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Training and validation {quantity}: reference path (solid), native path (dotted), Triton path (dashed)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    detail = f"{len(usable)} run(s)" + (f"; {'; '.join(notes)}" if notes else "")
    return FigureResult(name, "written", detail, str(out), series)


# --------------------------------------------------------------------------------------------------
# Error distributions of the check campaigns


def _number(value) -> float:
    """A number of a report; null (``jsonio``: not measured, a NaN when written) as NaN."""
    return math.nan if value is None else float(value)


def check_errors_figure(reports: dict[str, Path], out: Path) -> FigureResult:
    """``reports``: {campaign label: path of the JSON report a check command wrote}."""
    name = out.name
    loaded, notes = {}, []
    for label, path in reports.items():
        path = Path(path)
        if not path.is_file():
            notes.append(f"{label}: no {path}")
            continue
        try:
            cases = json.loads(path.read_text())["cases"]
            loaded[label] = [
                (c["dtype"], _number(c["max_abs"]), _number(c["max_rel"]), float(c["atol"]), bool(c["ok"]))
                for c in cases
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"{label}: {path} is not a check report ({type(exc).__name__}: {exc})")
    if not loaded:
        status = "failed" if any("is not a check report" in n for n in notes) else "skipped"
        return FigureResult(name, status, "; ".join(notes) + " (run the check commands first)")

    plt = pyplot()
    fig, axes = plt.subplots(len(loaded), 2, figsize=(11, 3.2 * len(loaded)), squeeze=False)
    series = []
    for row, (label, cases) in enumerate(loaded.items()):
        dtypes = sorted({c[0] for c in cases})
        for col, (metric, idx) in enumerate((("max abs error", 1), ("max rel error", 2))):
            ax = axes[row][col]
            for xi, dt in enumerate(dtypes):
                of_dtype = [c for c in cases if c[0] == dt]
                for j, c in enumerate(of_dtype):
                    v = c[idx]
                    if math.isnan(v):
                        continue
                    jitter = (j / max(len(of_dtype) - 1, 1) - 0.5) * 0.5
                    y = max(v, ZERO_FLOOR)
                    if c[4]:
                        ax.plot(xi + jitter, y, "o", color="tab:blue", markersize=3, alpha=0.7)
                    else:
                        ax.plot(xi + jitter, y, "x", color="tab:red", markersize=6)
                if idx == 1:
                    ax.hlines(of_dtype[0][3], xi - 0.35, xi + 0.35, colors="black", linewidth=1.5)
                series.append(f"{label} {dt} {metric}")
            ax.set_xticks(range(len(dtypes)), dtypes)
            ax.set_yscale("log")
            ax.set_title(f"{label}: {metric}" + (" (bar: atol)" if idx == 1 else ""), fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Error of every case against the oracle (zeros drawn at {ZERO_FLOOR:g}; red x: failed)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return FigureResult(
        name, "written", "; ".join([f"{k}: {len(v)} cases" for k, v in loaded.items()] + notes), str(out), series
    )


def make_figures(figures_dir: Path, runs_dir: Path, campaign_reports: dict[str, Path]) -> list[FigureResult]:
    """All figures into ``figures_dir``; each one independent of the others' inputs."""
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    makers = {
        "training_mse.png": lambda out: training_figure(runs_dir, out, "training_mse.png"),
        "training_loss.png": lambda out: training_figure(runs_dir, out, "training_loss.png"),
        "check_errors.png": lambda out: check_errors_figure(campaign_reports, out),
    }
    results = []
    for fname, make in makers.items():
        try:
            results.append(make(figures_dir / fname))
        except Exception as exc:  # a drawing bug in one figure must not hide the others
            results.append(FigureResult(fname, "failed", f"{type(exc).__name__}: {exc}"))
    return results
