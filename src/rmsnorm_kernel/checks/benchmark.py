"""Time the Triton RMSNorm against its peers on one GPU, in one run, on the same inputs.

For each shape and dtype, forward alone and forward + backward through autograd, for the Triton path
(``rmsnorm``) and every peer: the eager reference, ``torch.nn.functional.rms_norm``, ``torch.compile`` of
the reference (compiled afresh for each shape with ``dynamic=False``: ``torch.compiler.reset()`` between
shapes, so no recompile limit ever sends it back to eager code) and Liger-Kernel's
``LigerRMSNormFunction`` when it can be imported.

Protocol, as in Triton's tutorial:
- the machine's device-to-device copy bandwidth is measured first (a 1 GiB ``copy_``, bytes read plus
  bytes written): it is the ceiling every result is also reported against;
- inputs come from ``rmsnorm_kernel.testing.make_inputs`` (random, never zeros);
- every implementation's outputs (y; y, dx and dgamma) are checked against ``ops.reference.oracle``
  with ``ops.tolerances.compare`` in the same run; a wrong result marks the row failed, it is not
  timed and it can win nothing;
- CUDA events around whole calls (allocations and autograd included): 20 warm-up calls, then 50
  samples of 20 calls, the median sample divided by 20; ``triton.testing.do_bench``'s median is
  reported beside it, and the host time to issue a call (``time.perf_counter`` over the same samples);
- bytes are the fewest the operation must move: forward 2*M*N elements of x's dtype + N of gamma's;
  forward + backward 5*M*N (x and y; x, dy and dx) + 2*N (gamma, dgamma);
- a table is printed last (``report.format_table``) and every number goes to ``<outputs>/benchmark.json``
  (``report.write_report``), rewritten after every shape.

Without a CUDA GPU nothing can be timed: the command says so, runs a tiny correctness-only smoke of
the implementations that run on the CPU (the Triton path through Triton's interpreter, the reference,
``F.rms_norm``), writes the JSON with no timings, and exits 0 when every result is right, 1 otherwise
(``--require-gpu`` makes it exit 2 instead of running the smoke).

This module is the one home of what is measured and how: the implementations under test
(``IMPLS``, ``make_impl``, ``make_call``, ``LIGER_SETTINGS``), the oracle check (``check_outputs``), the
byte model (``bytes_moved``), the timing of whole calls (``event_samples``, ``cuda_timer``) and the
check-then-time of one row (``measure_row``). The repository's ``benchmarks`` package (the sweep over
hidden sizes, the launch-plan experiments) builds on them.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.backend import CUDA, backend
from ..ops.op import rmsnorm
from ..ops.reference import DEFAULT_EPS, oracle, rmsnorm_reference
from ..ops.tolerances import compare
from ..testing import make_inputs
from .report import at_least, dtype_name, format_table, one_line, outputs_problem, write_report

EPS = DEFAULT_EPS
FWD, FWD_BWD = "fwd", "fwd+bwd"
MODES = (FWD, FWD_BWD)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: The tutorial's shape, the training batch, and large ones of 128 MiB to 1 GiB per tensor.
FULL_SHAPES: tuple[tuple[int, int, str], ...] = (
    (128, 257, "float32"),
    (32, 257, "float32"),
    (4096, 4096, "float16"),
    (4096, 4096, "bfloat16"),
    (16384, 8192, "bfloat16"),
    (32768, 4096, "float32"),
    (8192, 4097, "float16"),
    (4096, 32768, "bfloat16"),
    (2048, 65536, "bfloat16"),
)
SMALL_SHAPES: tuple[tuple[int, int, str], ...] = ((128, 257, "float32"), (32, 257, "float32"), (4096, 4096, "float16"))
#: What the CPU smoke runs through the interpreter: small enough to take seconds.
CPU_SMOKE_SHAPES: tuple[tuple[int, int, str], ...] = ((4, 257, "float32"), (3, 33, "bfloat16"))

IMPLS = ("triton", "reference", "F.rms_norm", "compile", "liger")
#: Liger-Kernel's own defaults, used as they are: the comparison is against what users already have.
LIGER_SETTINGS = {"offset": 0.0, "casting_mode": "llama", "in_place": True}


# --------------------------------------------------------------------------------------------------
# The byte model
# --------------------------------------------------------------------------------------------------


def bytes_moved(mode: str, m: int, n: int, x_dtype: torch.dtype, gamma_dtype: torch.dtype | None = None) -> int:
    """The fewest bytes ``mode`` must move through device memory for an (M, N) problem.

    forward: read x, write y (2*M*N elements) and read gamma (N). forward + backward: the forward's
    2*M*N, then read x and dy and write dx (3*M*N), plus gamma read and dgamma written (2*N).
    """
    es = torch.empty((), dtype=x_dtype).element_size()
    gs = torch.empty((), dtype=gamma_dtype or x_dtype).element_size()
    if mode == FWD:
        return 2 * m * n * es + n * gs
    if mode == FWD_BWD:
        return 5 * m * n * es + 2 * n * gs
    raise ValueError(f"bytes_moved: mode is {mode!r}; accepted: {FWD!r}, {FWD_BWD!r}")


def tbps(nbytes: int, seconds: float | None) -> float | None:
    return None if not seconds else nbytes / seconds / 1e12


# --------------------------------------------------------------------------------------------------
# Checking against the oracle
# --------------------------------------------------------------------------------------------------


@dataclass
class Check:
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def check_outputs(outputs: tuple, expected: tuple, rows: list[int] | None = None) -> Check:
    """Compare (y,) or (y, dx, dgamma) with the oracle's under ``compare``; the first failing output
    is named in ``detail``. With ``rows``, ``expected`` holds y and dx on those rows only (dgamma whole)
    and the same rows of ``outputs`` are compared."""
    worst = Check(True, 0.0, 0.0)
    for i, (name, got, want) in enumerate(zip(("y", "dx", "dgamma"), outputs, expected)):
        if got is not None:
            got = got.detach()
            if rows is not None and i < 2 and got.dim() == 2:
                got = got.index_select(0, torch.tensor(rows, device=got.device))
        if got is None or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            got_desc = "None" if got is None else f"{tuple(got.shape)} {got.dtype}"
            return Check(
                False, math.inf, math.inf, f"{name}: got {got_desc}, expected {tuple(want.shape)} {want.dtype}"
            )
        c = compare(got, want)
        worst.ok = worst.ok and c.ok
        worst.max_abs, worst.max_rel = max(worst.max_abs, c.max_abs), max(worst.max_rel, c.max_rel)
        if not c.ok and not worst.detail:
            worst.detail = f"{name} outside tolerance (max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g})"
    return worst


# --------------------------------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------------------------------

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _liger_fn() -> ForwardFn | None:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # not installed, or it fails to import on this machine
        return None
    s = LIGER_SETTINGS
    # apply(X, W, eps, offset, casting_mode, in_place): positional, as autograd.Function.apply takes them.
    return lambda x, g: LigerRMSNormFunction.apply(x, g, EPS, s["offset"], s["casting_mode"], s["in_place"])


def liger_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:
        return None


def make_impl(name: str, device: str) -> ForwardFn | None:
    """The forward function of implementation ``name`` (None: not available here). ``compile`` must be
    made again for each shape (``run_benchmark`` does)."""
    if name == "triton":
        return lambda x, g: rmsnorm(x, g, EPS)
    if name == "reference":
        return lambda x, g: rmsnorm_reference(x, g, EPS)
    if name == "F.rms_norm":
        return lambda x, g: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, EPS)
    if name == "compile":
        torch.compiler.reset()  # a fresh cache for this shape: no recompile limit, no stale guards
        return torch.compile(lambda x, g: rmsnorm_reference(x, g, EPS), dynamic=False)
    if name == "liger":
        return _liger_fn() if device == "cuda" else None
    raise ValueError(f"benchmark: impl is {name!r}; accepted: {', '.join(IMPLS)}")


def make_call(mode: str, fn: ForwardFn, x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor) -> Callable[[], tuple]:
    """One whole call: forward alone on inputs that need no gradient, or forward + autograd backward.

    ``torch.autograd.grad`` returns dx and dgamma without accumulating into ``.grad`` (no extra kernel).
    """
    if mode == FWD:
        x0, g0 = x.detach(), gamma.detach()
        return lambda: (fn(x0, g0),)
    xl, gl = x.detach().requires_grad_(), gamma.detach().requires_grad_()

    def step():
        y = fn(xl, gl)
        dx, dgamma = torch.autograd.grad(y, (xl, gl), dy)
        return y, dx, dgamma

    return step


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    events_s: float | None  # median seconds per whole call, CUDA events around back-to-back calls
    gpu_s: float | None  # the GPU time: do_bench of the call here; the sweep times its CUDA graph's replays
    host_s: float | None = None  # median host seconds to issue one call (CPU side of the same samples)
    gpu_method: str | None = None  # how gpu_s was taken
    gpu_note: str = ""


#: A timer gets the call, a function putting back the inputs a call overwrites (Liger writes dx over dy)
#: and one checking a call's outputs against the oracle (None: right); the simple timers use the call only.
Timer = Callable[..., Timing]


def event_samples(fn: Callable[[], object], samples: int, calls: int) -> tuple[float, float]:
    """(median seconds per call by CUDA events, median host seconds to issue one call) over ``samples``
    samples of ``calls`` back-to-back calls.

    ``triton.testing.do_bench`` times one call at a time with the L2 cache flushed before each; this
    loop keeps the calls back to back, their host work and allocations included, as a caller runs them.
    """
    per_call, host = [], []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(per_call), statistics.median(host)


def cuda_timer(warmup: int = 20, samples: int = 50, calls: int = 20, do_bench: bool = True) -> Timer:
    """The benchmark's timer: ``warmup`` calls, then ``event_samples``; ``triton.testing.do_bench``'s
    median of the same call beside it (unless ``do_bench`` is False)."""

    def timer(call: Callable[[], object], restore=None, verify=None) -> Timing:
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        per_call, host = event_samples(call, samples, calls)
        if not do_bench:
            return Timing(per_call, None, host)
        import triton.testing

        bench = triton.testing.do_bench(call, warmup=10, rep=40, return_mode="median") / 1e3
        return Timing(per_call, bench, host, "do_bench")

    return timer


def no_timer(call: Callable[[], object], restore=None, verify=None) -> Timing:
    """Without a GPU: nothing is timed."""
    return Timing(None, None, None)


def copy_ceiling(device: str = "cuda", nbytes: int = 1 << 30, samples: int = 20, calls: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    seconds, _ = event_samples(lambda: dst.copy_(src), samples, calls)
    return 2 * nbytes / seconds


# --------------------------------------------------------------------------------------------------
# One row: checked, then timed
# --------------------------------------------------------------------------------------------------


@dataclass
class Result:
    shape: str
    M: int
    N: int
    dtype: str
    mode: str
    impl: str
    ok: bool
    detail: str
    max_abs: float | None
    max_rel: float | None
    bytes: int
    checked_rows: int | None = None  # rows of y and dx compared with the oracle (dgamma: always all)
    first_call_s: float | None = None  # the checked first call: compiles and Triton's JIT land here
    events_us: float | None = None
    gpu_us: float | None = None
    host_us: float | None = None
    gpu_method: str | None = None
    gpu_note: str = ""
    bandwidth_tbps: float | None = None  # from events_us
    gpu_tbps: float | None = None  # from gpu_us
    pct_of_ceiling: float | None = None  # bandwidth_tbps against the copy ceiling
    winner: bool = False
    speedup_vs_best_peer: float | None = None  # Triton rows: best correct peer's time / Triton's time


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def measure_row(
    mode: str,
    impl: str,
    fn: ForwardFn,
    inputs: tuple,
    expected: tuple,
    timer: Timer,
    ceiling_bps: float | None = None,
    rows: list[int] | None = None,
) -> Result:
    """Check one implementation in one direction against the oracle's ``expected`` outputs (y and dx on
    ``rows`` only when given, see ``check_outputs``), then time it with ``timer``. A failed check is not
    timed; an implementation that raises is a failed row; a timing that raises leaves the row checked
    but untimed, with the reason in ``gpu_note``."""
    x, gamma, dy = inputs
    m, n = x.shape
    nbytes = bytes_moved(mode, m, n, x.dtype, gamma.dtype)
    row = Result(
        shape=f"{m}x{n}",
        M=m,
        N=n,
        dtype=dtype_name(x.dtype),
        mode=mode,
        impl=impl,
        ok=False,
        detail="",
        max_abs=None,
        max_rel=None,
        bytes=nbytes,
        checked_rows=m if rows is None else len(rows),
    )
    want = expected[:1] if mode == FWD else expected
    cuda = x.device.type == "cuda"
    t0 = time.perf_counter()
    try:
        outputs = make_call(mode, fn, x, gamma, dy.clone())()  # its own dy: Liger writes dx over it
        if cuda:
            torch.cuda.synchronize()
        row.first_call_s = time.perf_counter() - t0
        check = check_outputs(outputs, want, rows)
        del outputs
    except Exception as exc:  # an implementation that raises is a failed row, not a failed run
        row.detail = f"raised {type(exc).__name__}: {exc}"[:300]
        return row
    row.ok, row.detail, row.max_abs, row.max_rel = check.ok, check.detail, check.max_abs, check.max_rel
    if not check.ok:
        return row
    work_dy = dy.clone()
    call = make_call(mode, fn, x, gamma, work_dy)

    def verify(outputs) -> str | None:
        c = check_outputs(outputs if isinstance(outputs, tuple) else (outputs,), want, rows)
        return None if c.ok else (c.detail or "outside tolerance")

    try:
        timing = timer(call, lambda: work_dy.copy_(dy), verify)
    except Exception as exc:  # out of memory, say: the row stays checked but untimed, the run goes on
        row.gpu_note = f"timing raised {one_line(exc)}"[:300]
        if cuda:
            torch.cuda.empty_cache()
        return row
    row.events_us, row.gpu_us, row.host_us = _us(timing.events_s), _us(timing.gpu_s), _us(timing.host_s)
    row.gpu_method, row.gpu_note = timing.gpu_method, timing.gpu_note
    row.bandwidth_tbps, row.gpu_tbps = tbps(nbytes, timing.events_s), tbps(nbytes, timing.gpu_s)
    if row.bandwidth_tbps is not None and ceiling_bps:
        row.pct_of_ceiling = 100.0 * row.bandwidth_tbps * 1e12 / ceiling_bps
    return row


def mark_winners(results: list[Result]) -> None:
    """Per (shape, dtype, mode): the fastest correct row by the events median wins; Triton rows get
    their speedup over the best correct peer."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.shape, r.dtype, r.mode), []).append(r)
    for rows in groups.values():
        timed = [r for r in rows if r.ok and r.events_us is not None]
        for r in rows:
            r.winner = False
        if timed:
            min(timed, key=lambda r: r.events_us).winner = True
        peers = [r for r in timed if r.impl != "triton"]
        for r in timed:
            if r.impl == "triton" and peers:
                r.speedup_vs_best_peer = min(p.events_us for p in peers) / r.events_us


def run_benchmark(
    shapes: Iterable[tuple[int, int, str]],
    impls: Iterable[str],
    device: str,
    timer: Timer,
    ceiling_bps: float | None,
    log: Callable[[str], None] = print,
    impl_factory: Callable[[str, str], ForwardFn | None] = make_impl,
    on_shape_done: Callable[[list[Result]], None] | None = None,
) -> list[Result]:
    results: list[Result] = []
    for m, n, name in shapes:
        inputs = make_inputs((m, n), DTYPES[name], device)
        expected = oracle(*inputs, EPS)
        for impl in impls:
            fn = impl_factory(impl, device)  # compile: a fresh compiled function for this shape
            if fn is None:
                log(f"  {impl}: not available here, skipped")
                continue
            for mode in MODES:
                row = measure_row(mode, impl, fn, inputs, expected, timer, ceiling_bps)
                results.append(row)
                status = "ok" if row.ok else f"FAILED: {row.detail}"
                timing = f"{row.events_us:.1f} us" if row.events_us is not None else "untimed"
                log(f"  {m}x{n} {name:8s} {mode:7s} {impl:10s} {timing:>12s}  {status}  ({row.first_call_s or 0:.1f}s)")
        del inputs, expected
        if device == "cuda":
            torch.cuda.empty_cache()
        if on_shape_done is not None:
            mark_winners(results)
            on_shape_done(results)
    mark_winners(results)
    return results


# --------------------------------------------------------------------------------------------------
# Output: the table (report.format_table) and the JSON report (report.write_report)
# --------------------------------------------------------------------------------------------------

TABLE_HEAD = ("shape", "dtype", "mode", "impl", "events us", "do_bench us", "host us", "TB/s", "% ceil", "check", "")


def table(results: list[Result], ceiling_tbps: float | None) -> str:
    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    rows = []
    for r in results:
        mark = "best" if r.winner else ""
        if r.impl == "triton" and r.speedup_vs_best_peer is not None:
            mark = (mark + " " if mark else "") + f"x{r.speedup_vs_best_peer:.2f} vs best peer"
        rows.append(
            (
                r.shape,
                r.dtype,
                r.mode,
                r.impl,
                f(r.events_us, ".1f"),
                f(r.gpu_us, ".1f"),
                f(r.host_us, ".1f"),
                f(r.bandwidth_tbps, ".2f"),
                f(r.pct_of_ceiling, ".0f"),
                "ok" if r.ok else "FAILED",
                mark,
            )
        )
    text = format_table(TABLE_HEAD, rows, right=range(4, 9), groups=[(r.shape, r.dtype) for r in results])
    ceiling = f"{ceiling_tbps:.2f} TB/s" if ceiling_tbps else "not measured"
    return text + f"\ncopy ceiling: {ceiling}; 'best': fastest correct row of its group (events median)"


def versions() -> dict:
    import triton

    return dict(
        torch=torch.__version__,
        triton=triton.__version__,
        liger_kernel=liger_version(),
        python=platform.python_version(),
    )


def report_body(timed: bool, device_name: str, ceiling_bps: float | None, results: list[Result], args) -> dict:
    """What ``benchmark.json`` holds besides what every report carries (``report.write_report``)."""
    protocol = dict(
        warmup_calls=args.warmup,
        samples=args.samples,
        calls_per_sample=args.calls,
        statistic="median",
        do_bench="triton.testing.do_bench(warmup=10 ms, rep=40 ms) median" if not args.no_do_bench else "off",
        bytes="fwd: 2*M*N*x + N*gamma; fwd+bwd: 5*M*N*x + 2*N*gamma",
        eps=EPS,
        inputs="rmsnorm_kernel.testing.make_inputs, seed 0",
        check="ops.tolerances.compare against ops.reference.oracle",
        compile="torch.compile(reference, dynamic=False), torch.compiler.reset() per shape",
    )
    return dict(
        timed=timed,
        **versions(),
        device=device_name,
        ceiling_tbps=None if ceiling_bps is None else ceiling_bps / 1e12,
        protocol=protocol,
        liger_settings=dict(LIGER_SETTINGS),
        results=results,
    )


def write(outputs: Path, timed: bool, device_name: str, ceiling_bps: float | None, results: list[Result], args) -> Path:
    """``<outputs>/benchmark.json``: ok when every Triton row is right."""
    ok = all(r.ok for r in results if r.impl == "triton")
    return write_report(outputs, "benchmark", ok, report_body(timed, device_name, ceiling_bps, list(results), args))


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def parse_impls(text: str) -> list[str]:
    """``--impls``: comma-separated names of ``IMPLS``, at least one (an argparse ``type``)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in IMPLS]
    if unknown or not names:
        what = f"unknown {', '.join(unknown)}" if unknown else f"{text!r} names no implementation"
        raise argparse.ArgumentTypeError(f"{what}; accepted: a comma-separated subset of {','.join(IMPLS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes",
        choices=("full", "small"),
        default="full",
        help="full: the nine shapes of the README (default); small: 128x257, 32x257 float32 and 4096x4096 float16",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small shapes and 10 samples instead of 50: a fast look, not a result"
    )
    parser.add_argument(
        "--impls",
        type=parse_impls,
        default=",".join(IMPLS),
        help=f"comma-separated subset of {','.join(IMPLS)} (default: all)",
    )
    parser.add_argument(
        "--outputs", type=Path, default=Path("outputs"), help="directory for benchmark.json (default: outputs)"
    )
    parser.add_argument("--warmup", type=at_least(0), default=20, help="warm-up calls before timing (default 20)")
    parser.add_argument("--samples", type=at_least(1), default=50, help="timed samples (default 50)")
    parser.add_argument("--calls", type=at_least(1), default=20, help="calls per sample (default 20)")
    parser.add_argument("--no-do-bench", action="store_true", help="skip triton.testing.do_bench")
    parser.add_argument(
        "--require-gpu", action="store_true", help="without a CUDA GPU exit 2 instead of running the CPU smoke"
    )


def _cpu_smoke(impls: list[str], args) -> int:
    impls = [i for i in impls if i not in ("compile", "liger")]
    results = run_benchmark(CPU_SMOKE_SHAPES, impls, "cpu", no_timer, None)
    path = write(args.outputs, False, platform.processor() or "cpu", None, results, args)
    print(f"\nwrote {path}\n")
    print(table(results, None))
    print("CPU smoke: correctness only, no timings (run on a CUDA GPU for the benchmark).")
    return 0 if all(r.ok for r in results) else 1


def run(args) -> int:
    """The command, on arguments parsed by a parser that ``add_arguments`` filled."""
    impls = args.impls
    if args.quick:
        args.samples = min(args.samples, 10)
    shapes = SMALL_SHAPES if (args.shapes == "small" or args.quick) else FULL_SHAPES
    problem = outputs_problem(args.outputs)
    if problem is not None:
        print(f"benchmark: {problem}", file=sys.stderr)
        return 2
    if backend() != CUDA:
        print("benchmark: no CUDA GPU here, so nothing can be timed (timings need a CUDA GPU).", file=sys.stderr)
        if args.require_gpu:
            return 2
        print(
            "benchmark: running a correctness-only smoke instead: tiny shapes through Triton's interpreter, "
            "checked against the oracle, no timings.",
            file=sys.stderr,
        )
        return _cpu_smoke(impls, args)

    device_name = torch.cuda.get_device_name()
    v = versions()
    print(f"benchmark on {device_name}: torch {v['torch']}, triton {v['triton']}, liger-kernel {v['liger_kernel']}")
    ceiling = copy_ceiling()
    print(f"device-to-device copy ceiling: {ceiling / 1e12:.2f} TB/s")
    timer = cuda_timer(args.warmup, args.samples, args.calls, do_bench=not args.no_do_bench)
    # The JSON is rewritten after every shape, so a run cut short still leaves what it measured.
    results = run_benchmark(
        shapes,
        impls,
        "cuda",
        timer,
        ceiling,
        on_shape_done=lambda rows: write(args.outputs, True, device_name, ceiling, rows, args),
    )
    path = write(args.outputs, True, device_name, ceiling, results, args)
    print(f"\nwrote {path}\n")
    print(f"{device_name}, torch {v['torch']}, triton {v['triton']}, liger-kernel {v['liger_kernel']}")
    print(table(results, ceiling / 1e12))
    # A peer outside the oracle's tolerance is a finding, reported in its row; a wrong Triton row fails the run.
    return 0 if all(r.ok for r in results if r.impl == "triton") else 1
