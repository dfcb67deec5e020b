"""The sweep as a command: measure the points, append each to the run's file, merge, write the page.

    python -m benchmarks.sweep [--shapes sweep|tiny] [--impls triton,compile,...] [--outputs DIR]
                               [--skip-done FILE...] [--no-noise] [--whole-ms MS] [--rep-ms MS]
                               [--plan] [--require-gpu]
    python -m benchmarks.sweep --merge [FILE...] [--outputs DIR]
    python -m benchmarks.sweep --report docs/speed.md [--results FILE...]

A run measures every point of ``points.sweep_points`` (``--plan`` lists them and measures nothing) with
every implementation of ``impls.IMPLS`` that is available, in both directions
(``measure.measure_point``), then the noise points again (``--no-noise``: not), and the copy ceiling of
each regime at its start and at its end. It appends one JSON line per point to
``<outputs>/benchmark-sweep.run.jsonl`` (``results``; an earlier file of that name is kept as
``.jsonl.prev<n>``), so that a run cut short leaves all it measured; ``--skip-done FILE...`` measures only
the points those files lack, into ``benchmark-sweep.run.after<n>.jsonl`` (n: the points skipped). At its
end a run merges its file (and the ``--skip-done`` files) into ``benchmark-sweep.json``,
``benchmark-sweep.md`` and ``figures/benchmark_sweep.png``; ``--merge FILE...`` does only that, for files
from several runs or machines (default: every ``benchmark-sweep.run*.jsonl`` in ``--outputs``), and needs
no GPU.

The committed results are ``docs/data/sweep.jsonl``: the run files behind the page, one after the other
(``cat outputs/benchmark-sweep.run*.jsonl > docs/data/sweep.jsonl``). ``--report docs/speed.md`` writes
the page from them, stamped with the device, the versions and the commit of the runs, and its figure
beside it (``docs/speed.png``); it needs no GPU.

torch.compile is the slow part: one compile per point and direction (an inference graph, then a
training graph), compiled per shape with ``dynamic=False`` as a user gets it; ``--impls`` without
``compile`` leaves it out.

Without a CUDA GPU nothing is timed: ``--shapes tiny`` runs four tiny points through Triton's
interpreter, checked against the oracle, with the same files and merge; any other sweep, or
``--require-gpu``, is refused in one line (exit 2).

Ctrl+C or SIGTERM stops the run after the point in progress: its file keeps every point measured, one
line says how to run the rest, and the exit status is 130 or 143. Before or after the points (reading the
files, merging, drawing), the signal stops the command at once with one line and the same status.

Exit status: 0 when every point was measured and the Triton path was right at each; 1, with one line, when
a Triton result was wrong (this run's or a merged earlier run's), or a correct row got no time on a GPU
(its timing raised; the row's ``gpu_note`` says how); 2 for a usage mistake (every argument and file is
checked before any work) or no GPU. A wrong peer is a finding in its row, not a failure of the run.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import triton

from rmsnorm_kernel.atomic import write_atomic
from rmsnorm_kernel.checks.figures import FigureResult
from rmsnorm_kernel.checks.report import outputs_problem
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.signals import stop_after_current

from ..common import (
    OneLineParser,
    at_least,
    comma_choices,
    exit_status,
    file_problem,
    keep_earlier_run,
    run_interruptible,
)
from ..impls import IMPLS, liger_version, make_impl, parse_impls, without_gpu
from ..timing import Timer, no_timer
from . import figures, report, results
from .measure import GPU_REP_MS, WHOLE_BUDGET_S, CudaTimers, Row, apply_ceilings, measure_ceiling, measure_point
from .measure import protocol as measure_protocol
from .points import ORIGINS, REGIME_BYTES, SHAPES, Point, definition_hash, noise_points, sweep_points

MiB = 1 << 20
RUN_STEM = "benchmark-sweep.run"
#: The committed results: the runs behind ``docs/speed.md``, one after the other.
RESULTS = Path("docs/data/sweep.jsonl")


class UsageError(ValueError):
    """An argument or a file the command cannot use: one line, exit status 2."""


# --------------------------------------------------------------------------------------------------
# The run's file
# --------------------------------------------------------------------------------------------------


def run_path(outputs: Path, skipped: int = 0) -> Path:
    return Path(outputs) / f"{RUN_STEM}{f'.after{skipped}' if skipped else ''}.jsonl"


def read_done(paths: Iterable[Path], shapes: str, definition: str) -> tuple[list[dict], set[str]]:
    """The run files of ``--skip-done`` and the point ids they measured (repeat 0); UsageError for a file
    that is not a run's file of this sweep."""
    try:
        runs = report.load_runs(paths)
    except report.MergeError as exc:
        raise UsageError(f"--skip-done: {exc}") from None
    for run in runs:
        if (run.get("shapes"), run.get("definition")) != (shapes, definition):
            raise UsageError(
                f"--skip-done: {run['file']} is a run of another sweep ({run.get('shapes')} {run.get('definition')}); "
                f"accepted: runs of --shapes {shapes} ({definition})"
            )
    return runs, {r["point"] for run in runs for r in run["rows"] if r.get("repeat", 0) == 0}


def commit() -> str | None:
    """The repository's commit (``git describe --always --dirty``: ``-dirty`` when the work tree differs
    from it), or None outside a git work tree."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


# --------------------------------------------------------------------------------------------------
# Running the points
# --------------------------------------------------------------------------------------------------


#: While the sweep runs, SIGINT (Ctrl+C) and SIGTERM ask it to stop after the point in progress rather
#: than interrupting whatever runs (an import, a compile, a timing), which would turn into a wrong row.
stop_on_signal = stop_after_current


def run_points(
    todo: Sequence[Point],
    repeats: Sequence[Point],
    impls: Sequence[str],
    device: str,
    timer: Timer,
    write: Callable[..., object],
    regimes_ceiling: dict[str, int] | None = None,
    impl_factory: Callable = make_impl,
    log: Callable[[str], None] = print,
    stop: Callable[[], str | None] = lambda: None,
) -> tuple[list[Row], list[dict], list[Point]]:
    """Measure ``todo`` then ``repeats`` (noise repeats, repeat=1) until done or ``stop()`` names a
    signal; ``write(rows, ceilings, remaining, elapsed_s)`` is called after every point, and at the end
    with ``done=True`` (``results.RunFile`` appends what is new). The copy ceiling of each regime of
    ``regimes_ceiling`` is measured (with ``timer``, a ``CudaTimers``) at the start and, unless stopped,
    at the end. Returns (rows, ceilings, points of ``todo`` left undone)."""
    t0 = time.perf_counter()
    rows: list[Row] = []
    ceilings: list[dict] = []
    regimes_ceiling = regimes_ceiling or {}
    for regime, nbytes in regimes_ceiling.items():
        c = measure_ceiling(regime, nbytes, timer, "start")
        ceilings.append(c)
        log(
            f"copy ceiling, {regime} ({nbytes / MiB:.0f} MiB): GPU {c['gpu_tbps']:.2f} TB/s ({c['gpu_method']}), "
            f"whole call {c['whole_tbps']:.2f} TB/s"
        )
    queue = [(p, 0) for p in todo] + [(p, 1) for p in repeats]
    remaining = list(todo)
    for i, (point, repeat) in enumerate(queue):
        if stop():
            log(f"{stop()}: stopping before {point.id}; {len(remaining)} point(s) left")
            break
        what = "noise repeat" if repeat else f"point {i + 1}/{len(todo)}"
        log(f"{what}: {point.id} ({point.split}, {point.origin})")
        point_t0 = time.perf_counter()
        rows += measure_point(point, impls, device, timer, repeat, impl_factory, log)
        log(f"  done in {time.perf_counter() - point_t0:.1f} s ({time.perf_counter() - t0:.0f} s so far)")
        if not repeat:
            remaining.remove(point)
        apply_ceilings(rows, ceilings)
        write(rows, ceilings, remaining, time.perf_counter() - t0)
    for regime, nbytes in regimes_ceiling.items() if not stop() else ():
        ceilings.append(measure_ceiling(regime, nbytes, timer, "end"))
    apply_ceilings(rows, ceilings)
    write(rows, ceilings, remaining, time.perf_counter() - t0, done=True)
    return rows, ceilings, remaining


# --------------------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------------------


def write_merge(merged: dict, outputs: Path) -> int:
    """Runs merged by ``report.merge`` into ``benchmark-sweep.json``, ``.md`` and the figure; print the
    report. Exit status: 1 when a Triton row is wrong, 0 otherwise."""
    json_path, md_path = report.write_merged(merged, outputs)
    (Path(outputs) / "figures").mkdir(exist_ok=True)
    figure_path = Path(outputs) / "figures" / figures.FIGURE
    keep_earlier_run("sweep", figure_path)
    try:
        fig = figures.sweep_figure(json_path, figure_path)
    except Exception as exc:  # a drawing bug must not hide the merged results
        fig = FigureResult(figures.FIGURE, "failed", f"{type(exc).__name__}: {exc}")
    print(md_path.read_text())
    print(f"wrote {json_path}, {md_path}; figure {fig.name}: {fig.status} ({fig.detail})")
    wrong = [r for r in merged["rows"] if r["impl"] == "triton" and not r.get("ok")]
    first = f" (first: {wrong[0]['point']} {wrong[0]['mode']}, {wrong[0].get('detail') or 'wrong'})" if wrong else ""
    return exit_status("sweep", len(wrong), f"Triton row(s) off the oracle{first}")


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m benchmarks.sweep",
        description="The Triton RMSNorm and its peers over hidden sizes and the shapes users run (narrow rows, "
        "activation-sized x, small batches, wide rows), checked against the oracle and timed two ways (whole "
        "call, CUDA-graph replays).",
    )
    parser.add_argument(
        "--shapes",
        choices=SHAPES,
        default="sweep",
        help="sweep: every point (default, needs a CUDA GPU); tiny: four tiny points, correctness only without a GPU",
    )
    parser.add_argument(
        "--impls",
        type=parse_impls,
        default=",".join(IMPLS),
        help=f"comma-separated subset of {','.join(IMPLS)} (default: all)",
    )
    parser.add_argument(
        "--outputs", type=Path, default=Path("outputs"), help="directory for the run's and the merged files"
    )
    parser.add_argument(
        "--skip-done",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="run files of earlier runs: the points they measured are not measured again (and are merged)",
    )
    parser.add_argument(
        "--origins",
        type=comma_choices("origin", ORIGINS),
        default=list(ORIGINS),
        help=f"measure only the points of these origins, a comma-separated subset of {','.join(ORIGINS)} "
        "(default: all); the others stay to do, for a later run with --skip-done",
    )
    parser.add_argument("--no-noise", action="store_true", help="skip the noise repeats at the end of the run")
    parser.add_argument(
        "--whole-ms",
        type=at_least(0.001, float),
        default=WHOLE_BUDGET_S * 1e3,
        help=f"time spent on the whole-call samples of one row (default {WHOLE_BUDGET_S * 1e3:g})",
    )
    parser.add_argument(
        "--rep-ms", type=at_least(1), default=GPU_REP_MS, help=f"do_bench's rep for the GPU time (default {GPU_REP_MS})"
    )
    parser.add_argument("--plan", action="store_true", help="print the points this run would measure; measure nothing")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=None,
        metavar="FILE",
        help="merge run files (default: every benchmark-sweep.run*.json in --outputs) into benchmark-sweep.json, "
        "benchmark-sweep.md and figures/benchmark_sweep.png; needs no GPU",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="MD",
        help="write the results page MD and its figure (MD's name, .png) from --results; needs no GPU",
    )
    parser.add_argument(
        "--results",
        type=Path,
        nargs="+",
        default=[RESULTS],
        metavar="FILE",
        help=f"the results files --report reads (default {RESULTS}): runs' files, or several concatenated",
    )
    parser.add_argument("--require-gpu", action="store_true", help="without a CUDA GPU exit 2 even for --shapes tiny")
    return parser


def print_plan(points: list[Point], todo: list[Point], repeats: list[Point], impls: list[str], done: int = 0) -> None:
    splits = {s: sum(p.split == s for p in points) for s in ("fit", "report")}
    compiles = 2 * (len(todo) + len(repeats)) if "compile" in impls else 0
    left = len(points) - done - len(todo)
    print(
        f"sweep: {len(points)} points ({splits['fit']} fit, {splits['report']} report), "
        f"{done} already done; this run: {len(todo)} point(s) + {len(repeats)} noise repeat(s), "
        f"impls {','.join(impls)}, {compiles} torch.compile graphs"
        + (f"; {left} point(s) of other origins left for another run" if left else "")
    )
    for pt in todo:
        print(f"  {pt.id:26s} {pt.split:6s} {pt.origin:7s} {pt.x_bytes / MiB:8.1f} MiB")
    for pt in repeats:
        print(f"  {pt.id:26s} noise repeat")


def _usage(message: str) -> int:
    print(f"sweep: {message}", file=sys.stderr)
    return 2


def resume_command(args, path: Path) -> str:
    """The command that measures what this run left: its own options, and ``--skip-done`` with its
    earlier files and its own."""
    words = ["python -m benchmarks.sweep", "--shapes", args.shapes, "--outputs", str(args.outputs)]
    if list(args.impls) != list(IMPLS):
        words += ["--impls", ",".join(args.impls)]
    if list(args.origins) != list(ORIGINS):
        words += ["--origins", ",".join(args.origins)]
    if args.no_noise:
        words.append("--no-noise")
    if args.whole_ms != WHOLE_BUDGET_S * 1e3:
        words += ["--whole-ms", f"{args.whole_ms:g}"]
    if args.rep_ms != GPU_REP_MS:
        words += ["--rep-ms", str(args.rep_ms)]
    if args.require_gpu:
        words.append("--require-gpu")
    words += ["--skip-done", *map(str, [*args.skip_done, path])]
    return " ".join(shlex.quote(w) if w != words[0] else w for w in words)


def report_command(args) -> str:
    """The command line that writes the page, as the page names it."""
    words = ["python -m benchmarks.sweep", "--report", Path(args.report).as_posix()]
    if list(args.results) != [RESULTS]:
        words += ["--results", *(Path(p).as_posix() for p in args.results)]
    return " ".join(shlex.quote(w) if i else w for i, w in enumerate(words))


def write_report(args) -> int:
    """``--report``: the results page and its figure from ``--results``. Exit status 0 once the page is
    written (a Triton row off the oracle is a finding the page lists); 2 with one line for a file it
    cannot read or write."""
    try:
        merged = report.merge(report.load_runs(args.results))  # in the files' order: the first run's rows count
    except report.MergeError as exc:
        return _usage(f"--results: {exc}")
    page = Path(args.report)
    problem = file_problem("--report", page)
    if problem is None and page.suffix != ".md":
        problem = f"--report {page}: not a .md file; accepted: a Markdown file (its figure goes beside it, as .png)"
    if problem:
        return _usage(problem)
    figure_path = page.with_suffix(".png")
    page.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig = figures.sweep_figure(merged, figure_path)
    except Exception as exc:  # a drawing bug must not hide the page
        fig = FigureResult(figures.FIGURE, "failed", f"{type(exc).__name__}: {exc}")
    write_atomic(page, report.speed_page(merged, report_command(args), figure_path.name if fig.path else None))
    wrong = sum(r["impl"] == "triton" and not r.get("ok") for r in merged["rows"])
    print(f"wrote {page} ({wrong} Triton row(s) off the oracle, listed there); figure {figure_path.name}: {fig.status}")
    return 0


def run(args) -> int:
    """The command on parsed arguments; every argument and file is checked before any work."""
    if args.plan and args.merge is not None:
        return _usage("--plan and --merge together: --plan writes nothing, --merge writes; accepted: one of them")
    if args.report is not None:
        if args.plan or args.merge is not None:
            return _usage("--report with --plan or --merge: --report only reads --results; accepted: one of them")
        return write_report(args)
    if args.merge is not None:  # the files first, then the folder: a refused merge creates nothing
        paths = list(args.merge) or sorted(Path(args.outputs).glob(f"{RUN_STEM}*.jsonl"))
        if not paths:
            return _usage(f"--merge: no run files given and none in {args.outputs} ({RUN_STEM}*.jsonl)")
        try:
            runs = report.load_runs(paths)
            if not args.merge:  # the folder's files: in the order their runs started, not their names'
                runs.sort(key=lambda run: str(run.get("date") or ""))
            merged = report.merge(runs)
        except report.MergeError as exc:
            return _usage(f"--merge: {exc}")
        problem = outputs_problem(args.outputs) or report.merged_paths_problem(args.outputs)
        return _usage(problem) if problem else write_merge(merged, args.outputs)
    impls = list(args.impls)
    points = sweep_points(args.shapes)
    definition = definition_hash(points)
    try:
        earlier, done = read_done(args.skip_done, args.shapes, definition)
    except UsageError as exc:
        return _usage(str(exc))
    if not args.plan and any(Path(p).resolve() == run_path(args.outputs, len(done)).resolve() for p in args.skip_done):
        return _usage(
            f"--skip-done {run_path(args.outputs, len(done))} is the file this run would write (after the same "
            f"{len(done)} points); accepted: another --outputs, or the file moved elsewhere first"
        )
    todo = [pt for pt in points if pt.id not in done and (pt.origin in args.origins or args.shapes == "tiny")]
    repeats = [] if args.no_noise else noise_points(points, args.shapes)
    if args.plan:  # what a GPU run would do; nothing runs, on any machine
        print_plan(points, todo, repeats, impls, len(done))
        return 0
    cuda = backend() == CUDA
    if not cuda and args.require_gpu:
        return _usage("--require-gpu: no CUDA GPU here")
    if not cuda and args.shapes != "tiny":
        return _usage(
            "no CUDA GPU here, so nothing can be timed; without one only --shapes tiny runs (correctness only), "
            f"not --shapes {args.shapes}"
        )
    if not cuda:
        try:
            impls = without_gpu(impls)
        except ValueError as exc:
            return _usage(str(exc))
    problem = outputs_problem(args.outputs) or report.merged_paths_problem(args.outputs)  # last: it makes the folder
    if problem is not None:
        return _usage(problem)
    if not cuda:
        print("sweep: no CUDA GPU: correctness only, through Triton's interpreter; nothing is timed.", file=sys.stderr)
    print_plan(points, todo, repeats, impls, len(done))
    device = "cuda" if cuda else "cpu"
    device_name = torch.cuda.get_device_name() if cuda else (platform.processor() or "cpu")
    timer = CudaTimers(args.whole_ms / 1e3, args.rep_ms) if cuda else no_timer
    meta = dict(
        shapes=args.shapes,
        definition=definition,
        points=len(points),
        skipped_done=len(done),
        impls=impls,
        timed=cuda,
        device=device_name,
        backend=backend(),
        torch=torch.__version__,
        triton=triton.__version__,
        liger_kernel=liger_version(),
        python=platform.python_version(),
        commit=commit(),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        protocol=measure_protocol(args.whole_ms / 1e3, args.rep_ms),
        noise_points=[pt.id for pt in repeats],
    )
    path = run_path(args.outputs, meta["skipped_done"])
    keep_earlier_run("sweep", path)  # as .jsonl.prev<n>: --merge reads *.jsonl files only, so it skips it
    print(f"{device_name}: torch {meta['torch']}, triton {meta['triton']}, liger-kernel {meta['liger_kernel']}")
    print(f"writing {path}, one line per point")
    regimes = sorted({pt.regime for pt in [*todo, *repeats]} & set(REGIME_BYTES)) if cuda else []
    with stop_on_signal() as stop:
        rows, _, remaining = run_points(
            todo,
            repeats,
            impls,
            device,
            timer,
            write=results.RunFile(path, meta),
            regimes_ceiling={r: REGIME_BYTES[r] for r in regimes},
            stop=stop,
        )
    print(f"\nwrote {path}")
    if stop() and remaining:
        print(
            f"sweep: stopped by {stop()}; {path} holds every point measured before it; "
            f"run the {len(remaining)} point(s) left with: {resume_command(args, path)}",
            file=sys.stderr,
        )
        return 128 + getattr(signal, stop()).value
    wrong = [r for r in rows if r.impl == "triton" and not r.ok]
    for r in wrong:
        print(f"Triton FAILED at {r.point} {r.mode}: {r.detail}")
    untimed = [r for r in rows if cuda and r.ok and r.gpu_us is None]  # a timing that raised: the row says why
    for r in untimed:
        print(f"no timing at {r.point} {r.mode} {r.impl}: {r.gpu_note}")
    merge_status = write_merge(report.merge([*earlier, *report.load_runs([path])]), args.outputs)  # earlier: read once
    if stop():  # during the noise repeats, every point measured: merged, and stopped as asked
        print(f"sweep: stopped by {stop()} in the noise repeats; every point was measured and merged", file=sys.stderr)
        return 128 + getattr(signal, stop()).value
    if merge_status:  # a Triton row off the oracle, this run's or an earlier one's: write_merge said so
        return 1
    return exit_status("sweep", len(untimed), "row(s) right but not timed (named above)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(None if argv is None else [str(a) for a in argv])
    return run_interruptible("sweep", lambda: run(args))
