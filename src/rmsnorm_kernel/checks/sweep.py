"""The sweep of issue 19: the Triton RMSNorm and its peers over hidden sizes, in two regimes, timed two ways.

The points (``sweep_points``, the one definition; ``--plan`` prints them):

- hidden sizes N at every multiple of 512 from 1024 to 16384, plus 1000, 4097 and 10000 (34 values);
- bfloat16 at every N; float16 and float32 at every fourth N of that sorted list, from its fourth on
  (2048, 4096, 5632, 7680, 9728, 11264, 13312, 15360: five even and three odd multiples of 512);
- two regimes: ``large``, x holds about 512 MiB (M = round(512 MiB / (N * itemsize))), and ``mid``, about
  32 MiB, where launch and tail effects show;
- shapes outside the sweep (``outside``, large regime): N = 3000, 6244 and 12295 between its points, and
  24576, 32768 and 65536 above it, so that a launch plan fitted to the sweep's points alone is caught;
- the benchmark command's small shapes (``benchmark.SMALL_SHAPES``), except one the sweep already holds;
- each point's split (issue 19, item 4): ``fit`` when it is a sweep point whose N is an even multiple of
  512, the points a launch plan may be fitted on; ``report`` for every other point.

Every implementation of the benchmark command (the Triton path, the eager reference, ``F.rms_norm``,
``torch.compile`` of the reference compiled afresh for each point with ``dynamic=False``, Liger-Kernel
when it imports) runs forward alone and forward + backward at every point. Each result is first checked
against the float64 oracle (``ops.reference.oracle``) with ``ops.tolerances.compare``: every row when x
has at most 2**24 elements; above that, 256 rows (the first 64, the last 64 and 128 spread between) for y
and dx, and dgamma over all rows, summed in float64 chunk by chunk (``sweep_measure.expected_outputs``).
A wrong result is not timed. Two times per call then (``sweep_measure.CudaTimers``):

- **whole call**: CUDA events around back-to-back eager calls, allocations, autograd and host work
  included, as the benchmark command times them; the median over samples (3 to 10 samples of 1 to 20
  calls, about 20 ms in all), with the host time to issue a call beside it;
- **GPU time**: the same call captured in a CUDA graph (``torch.cuda.CUDAGraph``, after warm-up calls on
  a side stream; ``torch.compile``'s function after its compilation), its replays timed by
  ``triton.testing.do_bench`` (median, L2 flushed before each replay, 15 ms of replays). A replay runs the
  call's kernels with no Python, launcher, autograd or allocator work between them, the same way for
  every implementation, so host work neither hides nor adds GPU time; it still counts the gaps between
  the call's kernels, which a training step also pays. The graph's replay is checked against the oracle
  once more. Where a call cannot be captured, or its replay is wrong, the GPU time is the sum of the
  call's kernel (and memcpy/memset) durations in ``torch.profiler``'s records (median of 5 calls, L2
  flushed before each): it leaves out the gaps between kernels. Each row names its method
  (``gpu_method``).

Bandwidth is the byte model of ``benchmark.bytes_moved`` (forward: read x, write y, read gamma;
forward + backward: that, then read x and dy, write dx, read gamma, write dgamma: 5*M*N + 2*N elements)
over the time. The copy ceiling is measured in the same run: a device-to-device ``copy_`` of each
regime's bytes (bytes read plus written), at the start and at the end of each run, as a whole call and
by ``do_bench`` of the copy kernel (not a graph: there ``copy_`` becomes a memcpy node on the copy
engines, which are slower); a row's share of the ceiling uses its regime's fastest copy
(``sweep_measure.best_ceilings``).

Budget: the whole sweep must take at most 20 minutes of GPU time in runs of at most 10 minutes.
``--part K/P`` runs the K-th of P parts (points dealt by estimated cost, the same split for every K);
each run writes ``benchmark-sweep.partKofP.json`` after every point and stops starting points at
``--deadline-s``; ``--skip-done FILE...`` runs what an earlier run left; ``--merge`` combines the runs'
files into ``benchmark-sweep.json``, ``benchmark-sweep.md`` (worst ratios, noise, targets) and
``figures/benchmark_sweep.png`` (``sweep_report``; needs no GPU). Every run also measures the noise
points (``NOISE``) again at its end, so the merged file holds each of them two or more times, from
different processes: their spread is the run-to-run noise the report states.

torch.compile is the cost that decides the budget: one compile per point and direction (an inference
graph, then a training graph), 2 x 117 compiles with the noise repeats, a few seconds each. It stays compiled per shape,
as the issue's peer is defined: compiling once per N with M dynamic would halve that cost but time a
different program than the per-shape compile a user gets with ``dynamic=False``. Sharing a compiled
function between dtypes saves nothing (a dtype change recompiles). The estimate printed before a run
counts these compiles (``EST_*`` constants; each row records ``first_call_s``, which holds its compile,
to replace the guesses).

Without a CUDA GPU nothing is timed: ``--shapes tiny`` runs four tiny points through Triton's
interpreter, checked against the oracle, with the same files, parts and merge; any other sweep refuses
in one line (exit 2).

Exit status of a run: 0 when every point of the part was measured and the Triton path was right at each;
1 when a Triton result was wrong, or a correct row got no time on a GPU (its timing raised; the row's
``gpu_note`` says how); 2 for a usage problem or no GPU; 3 when the deadline left points for
``--skip-done``. A wrong peer is a finding in its row, not a failure of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import math
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..ops.backend import CUDA, backend
from . import benchmark as bm
from .report import outputs_problem
from .sweep_measure import (
    GPU_REP_MS,
    GPU_WARMUP_MS,
    GRAPH_WARMUP_CALLS,
    WHOLE_BUDGET_S,
    WHOLE_MIN_SAMPLES,
    CudaTimers,
    NoTimers,
    Row,
    apply_ceilings,
    measure_ceiling,
    measure_point,
    protocol,
)

MiB = 1 << 20
EPS = bm.EPS
FWD, FWD_BWD, MODES = bm.FWD, bm.FWD_BWD, bm.MODES

# --------------------------------------------------------------------------------------------------
# The points
# --------------------------------------------------------------------------------------------------

GRID_FIRST, GRID_LAST, GRID_STEP = 1024, 16384, 512
EXTRA_N = (1000, 4097, 10000)
OTHER_DTYPES = ("float16", "float32")
#: float16 and float32 at sorted-N positions 3, 7, 11...: 2048 and 4096 among them, five even and three
#: odd multiples of 512, so both splits have points in every dtype.
OTHER_DTYPE_EVERY, OTHER_DTYPE_OFFSET = 4, 3
REGIME_BYTES = {"large": 512 * MiB, "mid": 32 * MiB}
OUTSIDE_REGIME = "large"
#: (N, dtype) outside the sweep: between its points (6244 = 6144 + 100, 12295 = 12288 + 7) and above it.
OUTSIDE: tuple[tuple[int, str], ...] = (
    (3000, "bfloat16"),
    (6244, "bfloat16"),
    (12295, "bfloat16"),
    (24576, "bfloat16"),
    (32768, "bfloat16"),
    (65536, "bfloat16"),
    (24576, "float32"),
)
#: (regime, dtype, N): measured again at the end of every run; their spread is the stated noise.
NOISE: tuple[tuple[str, str, int], ...] = (
    ("large", "bfloat16", 4096),
    ("large", "bfloat16", 10000),
    ("mid", "bfloat16", 4096),
    ("mid", "bfloat16", 1000),
)
#: --shapes tiny: the same machinery on a few rows, small enough for Triton's interpreter.
TINY: tuple[tuple[int, int, str], ...] = (
    (3, 1024, "bfloat16"),
    (3, 1536, "bfloat16"),
    (5, 1000, "float32"),
    (2, 4097, "float16"),
)
SHAPES = ("sweep", "tiny")


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=bm.DTYPES[dtype]).element_size()


@dataclass(frozen=True)
class Point:
    regime: str  # "large", "mid", "small" or "tiny"
    origin: str  # "sweep", "outside", "small" or "tiny"
    M: int
    N: int
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.regime}:{self.dtype}:{self.M}x{self.N}"

    @property
    def split(self) -> str:
        """``fit``: a sweep point (or its tiny stand-in) whose N is an even multiple of 512; else ``report``."""
        fit = self.origin in ("sweep", "tiny") and self.N % (2 * GRID_STEP) == 0
        return "fit" if fit else "report"

    @property
    def x_bytes(self) -> int:
        return self.M * self.N * itemsize(self.dtype)


def sweep_ns() -> list[int]:
    """The sweep's hidden sizes, sorted."""
    return sorted({*range(GRID_FIRST, GRID_LAST + 1, GRID_STEP), *EXTRA_N})


def dtypes_at(index: int) -> tuple[str, ...]:
    """The dtypes measured at the ``index``-th N of ``sweep_ns()``."""
    return ("bfloat16", *OTHER_DTYPES) if index % OTHER_DTYPE_EVERY == OTHER_DTYPE_OFFSET else ("bfloat16",)


def rows_for(nbytes: int, n: int, dtype: str) -> int:
    """M such that an (M, N) tensor of ``dtype`` holds about ``nbytes``."""
    return max(1, round(nbytes / (n * itemsize(dtype))))


def sweep_points(shapes: str = "sweep") -> list[Point]:
    """Every point of ``shapes`` ("sweep" or "tiny"), in the order they are measured within a part."""
    if shapes == "tiny":
        return [Point("tiny", "tiny", m, n, dt) for m, n, dt in TINY]
    if shapes != "sweep":
        raise ValueError(f"sweep: shapes is {shapes!r}; accepted: {', '.join(SHAPES)}")
    points = []
    for regime, nbytes in REGIME_BYTES.items():
        for i, n in enumerate(sweep_ns()):
            points += [Point(regime, "sweep", rows_for(nbytes, n, dt), n, dt) for dt in dtypes_at(i)]
    points += [
        Point(OUTSIDE_REGIME, "outside", rows_for(REGIME_BYTES[OUTSIDE_REGIME], n, dt), n, dt) for n, dt in OUTSIDE
    ]
    held = {(p.M, p.N, p.dtype) for p in points}
    points += [Point("small", "small", m, n, dt) for m, n, dt in bm.SMALL_SHAPES if (m, n, dt) not in held]
    return points


def definition_hash(points: Sequence[Point]) -> str:
    """Names a list of points: runs of different sweeps cannot be merged."""
    return hashlib.sha1("\n".join(p.id for p in points).encode()).hexdigest()[:12]


def noise_points(points: Sequence[Point], shapes: str = "sweep") -> list[Point]:
    """The points each run measures again at its end: ``NOISE`` (the first point of a tiny sweep)."""
    if shapes == "tiny":
        return list(points[:1])
    by_key = {(p.regime, p.dtype, p.N): p for p in points if p.origin == "sweep"}
    return [by_key[key] for key in NOISE]


# --------------------------------------------------------------------------------------------------
# The estimate, and the parts
# --------------------------------------------------------------------------------------------------

#: Guesses, to be replaced with what a run records (first_call_s holds compiles, measure_s the rest).
EST_STARTUP_S = 45.0  # imports, CUDA context, the copy ceilings at start and end, Inductor's first compile
EST_POINT_SETUP_S = 0.3  # inputs, the oracle (dgamma over all rows in float64), freeing memory
EST_COMPILE_S = {FWD: 1.5, FWD_BWD: 2.5}  # torch.compile of the reference, one graph per direction and point
EST_JIT_S = 0.3  # first-use Triton compiles of the Triton path or Liger at a point, averaged over points
EST_FIXED_S = 0.12  # per measurement: the oracle check, the graph capture and its replay's check
EST_BANDWIDTH = {"triton": 3.5e12, "compile": 3.0e12, "liger": 3.0e12, "F.rms_norm": 2.0e12, "reference": 0.3e12}
EST_HOST_S = {FWD: 40e-6, FWD_BWD: 250e-6}  # host work of one eager call
EST_FLUSH_S = 0.15e-3  # per do_bench repetition: its L2 flush and host work
EST_INTERPRETER_S = 0.5  # per measurement through Triton's interpreter (no timing)

DEFAULT_DEADLINE_S = 510


def estimate_measurement_s(point: Point, impl: str, mode: str, timed: bool = True) -> float:
    """Seconds to check and time one implementation in one direction at ``point`` (compile included)."""
    if not timed:
        return EST_INTERPRETER_S
    nbytes = bm.bytes_moved(mode, point.M, point.N, bm.DTYPES[point.dtype])
    t_gpu = nbytes / EST_BANDWIDTH.get(impl, 1e12)
    t_call = max(t_gpu, EST_HOST_S[mode])
    whole = max(WHOLE_BUDGET_S, WHOLE_MIN_SAMPLES * t_call) + 3 * t_call
    # do_bench: 5 estimating calls, warm-up, then about rep / (call + flush) flushed repetitions.
    reps = 5 + max(1, int(GPU_REP_MS / 1e3 / (t_gpu + EST_FLUSH_S)))
    gpu = (GRAPH_WARMUP_CALLS + 2) * t_gpu + GPU_WARMUP_MS / 1e3 + reps * (t_gpu + EST_FLUSH_S)
    compile_s = EST_COMPILE_S[mode] if impl == "compile" else 0.0
    return EST_FIXED_S + compile_s + whole + gpu


def estimate_point_s(point: Point, impls: Iterable[str] = bm.IMPLS, timed: bool = True) -> float:
    impls = list(impls)
    jit = EST_JIT_S * sum(i in ("triton", "liger") for i in impls) if timed else 0.0
    return EST_POINT_SETUP_S + jit + sum(estimate_measurement_s(point, i, m, timed) for i in impls for m in MODES)


def estimate_run(points: Sequence[Point], repeats: Sequence[Point], impls: Iterable[str], timed: bool = True) -> dict:
    """The estimated seconds of one run, in parts: startup, compiles and the rest."""
    impls = list(impls)
    every = [*points, *repeats]
    compiles = 2 * len(every) if "compile" in impls and timed else 0
    compile_s = sum(EST_COMPILE_S.values()) * len(every) if compiles else 0.0
    total = sum(estimate_point_s(p, impls, timed) for p in every)
    startup = EST_STARTUP_S if timed else 0.0
    return dict(
        points=len(points),
        repeats=len(repeats),
        compiles=compiles,
        startup_s=startup,
        compile_s=compile_s,
        measure_s=total - compile_s,
        total_s=startup + total,
    )


def partition(points: Sequence[Point], parts: int) -> list[list[Point]]:
    """``points`` dealt into ``parts`` parts of about equal estimated time (largest first, each to the
    least loaded part), each part in the points' own order. Depends on the points alone, so that every
    run of a sweep sees the same split whatever its options."""
    if parts < 1:
        raise ValueError(f"sweep: {parts} parts; accepted: 1 or more")
    loads, dealt = [0.0] * parts, [[] for _ in range(parts)]
    for p in sorted(points, key=lambda p: (-estimate_point_s(p), p.id)):
        k = min(range(parts), key=lambda i: (loads[i], i))
        dealt[k].append(p)
        loads[k] += estimate_point_s(p)
    order = {p.id: i for i, p in enumerate(points)}
    return [sorted(d, key=lambda p: order[p.id]) for d in dealt]


def parse_part(text: str) -> tuple[int, int]:
    try:
        k, p = (int(s) for s in text.split("/"))
    except ValueError:
        raise SystemExit(f"sweep: --part is {text!r}; accepted: K/P with 1 <= K <= P, e.g. 1/2") from None
    if not 1 <= k <= p:
        raise SystemExit(f"sweep: --part is {text!r}; accepted: K/P with 1 <= K <= P, e.g. 1/2")
    return k, p


# --------------------------------------------------------------------------------------------------
# One run (a part), its file
# --------------------------------------------------------------------------------------------------


def part_path(outputs: Path, k: int, p: int, done: int = 0) -> Path:
    suffix = f".after{done}" if done else ""
    return Path(outputs) / f"benchmark-sweep.part{k}of{p}{suffix}.json"


def read_done(paths: Iterable[Path]) -> set[str]:
    """Point ids measured (repeat 0) in earlier run files."""
    done = set()
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            done |= {r["point"] for r in data["rows"] if r.get("repeat", 0) == 0}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(
                f"sweep: --skip-done {path} is not a sweep run's file ({type(exc).__name__}: {exc})"
            ) from None
    return done


def _finite(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def session_report(meta: dict, rows: list[Row], ceilings: list[dict], remaining: list[Point], elapsed_s: float) -> dict:
    return dict(
        kind="benchmark-sweep-run",
        **meta,
        elapsed_s=elapsed_s,
        complete=not remaining,
        remaining=[p.id for p in remaining],
        ceilings=ceilings,
        rows=[{k: _finite(v) for k, v in asdict(r).items()} for r in rows],
    )


def keep_previous(path: Path) -> Path | None:
    """An earlier run's file at ``path`` renamed to ``<path>.prev<n>`` (the first n free), so that running a
    part again never loses a measurement; ``--merge`` reads ``*.json`` files only, so it skips these."""
    path = Path(path)
    if not path.exists():
        return None
    n = 1
    while path.with_name(f"{path.name}.prev{n}").exists():
        n += 1
    kept = path.with_name(f"{path.name}.prev{n}")
    path.rename(kept)
    return kept


def write_json(path: Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False))
    tmp.replace(path)
    return path


@contextlib.contextmanager
def stop_on_signal():
    """While the sweep runs, SIGINT (Ctrl+C) and SIGTERM ask it to stop after the point in progress rather
    than interrupting whatever runs (an import, a compile, a timing), which would turn into a wrong row.
    Yields a callable giving the signal's name once one arrived (None before). A second signal acts as
    it would without this (only in the main thread, where Python runs signal handlers)."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        received.append(signal.Signals(signum).name)
        for s, h in previous.items():
            signal.signal(s, h)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield lambda: received[0] if received else None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_part(
    todo: Sequence[Point],
    repeats: Sequence[Point],
    impls: Sequence[str],
    device: str,
    timers,
    write: Callable[[list[Row], list[dict], list[Point], float], object],
    deadline_s: float | None = None,
    regimes_ceiling: dict[str, int] | None = None,
    impl_factory: Callable = bm.make_impl,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.perf_counter,
    started: float | None = None,
    stop: Callable[[], str | None] = lambda: None,
) -> tuple[list[Row], list[dict], list[Point]]:
    """Measure ``todo`` then ``repeats`` (noise repeats, repeat=1) until ``deadline_s`` (counted from
    ``started`` on ``clock``, default: now) would be passed, or ``stop()`` names a signal;
    ``write`` is called after every point. Returns (rows, ceilings, points of ``todo`` left undone)."""
    t0 = clock() if started is None else started
    rows: list[Row] = []
    ceilings: list[dict] = []
    regimes_ceiling = regimes_ceiling or {}
    for regime, nbytes in regimes_ceiling.items():
        ceilings.append(measure_ceiling(regime, nbytes, timers, "start"))
        c = ceilings[-1]
        log(
            f"copy ceiling, {regime} ({nbytes / MiB:.0f} MiB): GPU {c['gpu_tbps']:.2f} TB/s ({c['gpu_method']}), "
            f"whole call {c['whole_tbps']:.2f} TB/s"
        )
    queue = [(p, 0) for p in todo] + [(p, 1) for p in repeats]
    remaining = list(todo)
    for i, (point, repeat) in enumerate(queue):
        est = estimate_point_s(point, impls, timers.timed)
        if stop():
            log(f"{stop()}: stopping before {point.id}; {len(remaining)} point(s) left")
            break
        if deadline_s and clock() - t0 + est > deadline_s:
            log(
                f"deadline: {clock() - t0:.0f} s spent; {point.id} (about {est:.0f} s) would end past the "
                f"{deadline_s:.0f} s allowed; {len(remaining)} point(s) left"
            )
            break
        what = "noise repeat" if repeat else f"point {i + 1}/{len(todo)}"
        log(f"{what}: {point.id} ({point.split}, {point.origin}), estimate {est:.1f} s")
        point_t0 = clock()
        rows += measure_point(point, impls, device, timers, repeat, impl_factory, log)
        log(f"  done in {clock() - point_t0:.1f} s ({clock() - t0:.0f} s so far)")
        if not repeat:
            remaining.remove(point)
        apply_ceilings(rows, ceilings)
        write(rows, ceilings, remaining, clock() - t0)
    for regime, nbytes in regimes_ceiling.items() if not stop() else ():
        ceilings.append(measure_ceiling(regime, nbytes, timers, "end"))
    apply_ceilings(rows, ceilings)
    write(rows, ceilings, remaining, clock() - t0)
    return rows, ceilings, remaining


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes",
        choices=SHAPES,
        default="sweep",
        help="sweep: the points of issue 19 (default, needs a CUDA GPU); tiny: four tiny points, "
        "correctness only without a GPU",
    )
    parser.add_argument(
        "--part", default="1/1", help="K/P: run the K-th of P parts of about equal estimated time (default 1/1)"
    )
    parser.add_argument(
        "--impls", default=",".join(bm.IMPLS), help=f"comma-separated subset of {','.join(bm.IMPLS)} (default: all)"
    )
    parser.add_argument(
        "--outputs",
        type=Path,
        default=Path("outputs"),
        help="directory for the run's and the merged files (default: outputs)",
    )
    parser.add_argument(
        "--skip-done",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="run files of earlier runs: the points they measured are not measured again",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help=f"start no point that the estimate says would end past this many seconds (default {DEFAULT_DEADLINE_S}; 0: none)",
    )
    parser.add_argument("--no-noise", action="store_true", help="skip the noise repeats at the end of the run")
    parser.add_argument(
        "--whole-ms",
        type=float,
        default=WHOLE_BUDGET_S * 1e3,
        help="time spent on the whole-call samples of one row (default 20)",
    )
    parser.add_argument(
        "--rep-ms", type=int, default=GPU_REP_MS, help=f"do_bench's rep for the GPU time (default {GPU_REP_MS})"
    )
    parser.add_argument("--plan", action="store_true", help="print the part's points and the estimate; measure nothing")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=None,
        metavar="FILE",
        help="merge run files (default: every benchmark-sweep.part*.json in --outputs) into benchmark-sweep.json, "
        "benchmark-sweep.md and figures/benchmark_sweep.png; needs no GPU",
    )
    parser.add_argument("--require-gpu", action="store_true", help="without a CUDA GPU exit 2 even for --shapes tiny")


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def print_plan(
    points: list[Point],
    parts: list[list[Point]],
    k: int,
    todo: list[Point],
    repeats: list[Point],
    impls: list[str],
    timed: bool,
    deadline_s: float | None,
) -> dict:
    est = estimate_run(todo, repeats, impls, timed)
    whole = [estimate_run(part, repeats, bm.IMPLS, True)["total_s"] for part in parts]
    splits = {s: sum(p.split == s for p in points) for s in ("fit", "report")}
    print(
        f"sweep: {len(points)} points ({splits['fit']} fit, {splits['report']} report) in {len(parts)} part(s); "
        f"estimated GPU time of the parts: {', '.join(_fmt_s(w) for w in whole)} (total {_fmt_s(sum(whole))})"
    )
    print(
        f"this run: part {k}/{len(parts)}, {est['points']} point(s) + {est['repeats']} noise repeat(s), impls {','.join(impls)}; "
        f"{est['compiles']} torch.compile graphs (about {_fmt_s(est['compile_s'])}), measurements about "
        f"{_fmt_s(est['measure_s'])}, startup {_fmt_s(est['startup_s'])}: about {_fmt_s(est['total_s'])}"
    )
    if deadline_s and est["total_s"] > deadline_s:
        print(
            f"sweep: the estimate passes the {deadline_s:.0f} s deadline: the run stops there; run the rest with --skip-done"
        )
    return est


def run(args) -> int:
    from . import sweep_report

    started = time.perf_counter()  # the deadline counts from here (the imports before take seconds)
    problem = None if args.plan else outputs_problem(args.outputs)
    if problem is not None:
        print(f"sweep: {problem}", file=sys.stderr)
        return 2
    if args.merge is not None:
        return sweep_report.merge_command(args.merge, args.outputs)
    impls = bm.parse_impls(args.impls)
    k, p = parse_part(args.part)
    points = sweep_points(args.shapes)
    parts = partition(points, p)
    done = read_done(args.skip_done)
    todo = [pt for pt in parts[k - 1] if pt.id not in done]
    repeats = [] if args.no_noise else noise_points(points, args.shapes)
    cuda = backend() == CUDA
    deadline = args.deadline_s or None
    if args.plan:  # what a GPU run of this part would do; nothing runs, on any machine
        print_plan(points, parts, k, todo, repeats, impls, True, deadline)
        for pt in todo:
            print(
                f"  {pt.id:26s} {pt.split:6s} {pt.origin:7s} {pt.x_bytes / MiB:8.1f} MiB  about {estimate_point_s(pt, impls):.1f} s"
            )
        for pt in repeats:
            print(f"  {pt.id:26s} noise repeat")
        return 0
    if not cuda and (args.shapes != "tiny" or args.require_gpu):
        print(
            f"sweep: no CUDA GPU here, so nothing can be timed; without one only --shapes tiny runs (correctness only)"
            f"{'' if args.shapes == 'tiny' else f', not --shapes {args.shapes}'}.",
            file=sys.stderr,
        )
        return 2
    if not cuda:
        impls = [i for i in impls if i not in ("compile", "liger")]
    est = print_plan(points, parts, k, todo, repeats, impls, cuda, deadline)

    import triton

    device = "cuda" if cuda else "cpu"
    device_name = torch.cuda.get_device_name() if cuda else (platform.processor() or "cpu")
    timers = CudaTimers(args.whole_ms / 1e3, args.rep_ms) if cuda else NoTimers()
    if not cuda:
        print("sweep: no CUDA GPU: correctness only, through Triton's interpreter; nothing is timed.", file=sys.stderr)
    meta = dict(
        shapes=args.shapes,
        definition=definition_hash(points),
        part=f"{k}/{p}",
        points_in_part=len(parts[k - 1]),
        skipped_done=len(parts[k - 1]) - len(todo),
        impls=impls,
        timed=cuda,
        device=device_name,
        backend=backend(),
        torch=torch.__version__,
        triton=triton.__version__,
        liger_kernel=bm.liger_version(),
        python=platform.python_version(),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        estimate_s=est["total_s"],
        protocol=protocol(),
        noise_points=[pt.id for pt in repeats],
    )
    path = part_path(args.outputs, k, p, meta["skipped_done"])
    kept = keep_previous(path)
    if kept is not None:
        print(f"sweep: {path} held an earlier run; kept as {kept}")
    print(
        f"{device_name}: torch {meta['torch']}, triton {meta['triton']}, liger-kernel {meta['liger_kernel']}; writing {path}"
    )
    regimes = sorted({pt.regime for pt in [*todo, *repeats]} & set(REGIME_BYTES)) if cuda else []
    with stop_on_signal() as stop:
        rows, _, remaining = run_part(
            todo,
            repeats,
            impls,
            device,
            timers,
            write=lambda r, c, rem, el: write_json(path, session_report(meta, r, c, rem, el)),
            deadline_s=deadline,
            regimes_ceiling={r: REGIME_BYTES[r] for r in regimes},
            started=started,
            stop=stop,
        )
    print(f"\nwrote {path}")
    if stop():
        print(
            f"sweep: stopped by {stop()}; {path} holds every point measured before it, and {len(remaining)} "
            f"point(s) left run with: --part {k}/{p} --skip-done {path}",
            file=sys.stderr,
        )
        return 128 + getattr(signal, stop()).value
    wrong = [r for r in rows if r.impl == "triton" and not r.ok]
    for r in wrong:
        print(f"Triton FAILED at {r.point} {r.mode}: {r.detail}")
    untimed = [r for r in rows if cuda and r.ok and r.gpu_us is None]  # a timing that raised: the row says why
    for r in untimed:
        print(f"no timing at {r.point} {r.mode} {r.impl}: {r.gpu_note}")
    if remaining:
        print(
            f"sweep: {len(remaining)} point(s) of part {k}/{p} left; run them with: --part {k}/{p} --skip-done {path}"
        )
    print(
        "merge the parts (no GPU needed): python -m rmsnorm_kernel benchmark-sweep --merge <run files> --outputs <dir>"
    )
    return 1 if wrong or untimed else (3 if remaining else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rmsnorm_kernel.checks.sweep", description=__doc__.strip().split("\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
