"""Time the Triton RMSNorm against its peers on one GPU, in one run, on the same inputs.

For each shape and dtype, forward alone and forward + backward through autograd, for the Triton path
(``rmsnorm``) and every peer: the eager reference, ``torch.nn.functional.rms_norm``, ``torch.compile`` of
the reference (compiled afresh for each shape with ``dynamic=False``: dynamo is reset between shapes,
so no recompile limit ever sends it back to eager code) and Liger-Kernel's ``LigerRMSNormFunction`` when
it can be imported.

Protocol, as in Triton's tutorial:
- the machine's device-to-device copy bandwidth is measured first (a 1 GiB ``copy_``, bytes read plus
  bytes written): it is the ceiling every result is also reported against;
- inputs are random (``randn``; gamma = 1 + 0.5 randn), never zeros;
- every implementation's outputs (y; y, dx and dgamma) are checked against the oracle
  (``reference.rmsnorm_reference`` and ``reference.manual_backward``, evaluated in float64 and rounded to
  the inputs' dtypes) under ``tolerances.TOLERANCES`` in the same run; a wrong result marks the row
  failed and it can win nothing;
- CUDA events around whole calls (allocations and autograd included): 20 warm-up calls, then 50
  samples of 20 calls, the median sample divided by 20; ``triton.testing.do_bench``'s median is
  reported beside it;
- bytes are the fewest the operation must move: forward 2*M*N elements of x's dtype + N of gamma's;
  forward + backward 5*M*N (x and y; x, dy and dx) + 2*N (gamma, dgamma);
- a table is printed last and every number goes to ``<outputs>/benchmark.json``.

Without a CUDA GPU nothing can be timed: the command says so, runs a tiny correctness-only smoke of
the implementations that run on the CPU (the Triton path through Triton's interpreter, the reference,
``F.rms_norm``), writes the JSON with no timings, and exits 0 when every result is right, 1 otherwise
(``--require-gpu`` makes it exit 2 instead of running the smoke).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..ops import kernels
from ..ops.backend import CUDA, backend
from ..ops.contract import check_forward
from ..ops.op import _RMSNormFunction, rmsnorm
from ..ops.reference import DEFAULT_EPS, manual_backward, rmsnorm_reference
from ..ops.tolerances import TOLERANCES, compare

EPS = DEFAULT_EPS
FWD, FWD_BWD = "fwd", "fwd+bwd"
MODES = (FWD, FWD_BWD)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: The issue's shapes: the tutorial's, the training batch, and the large ones.
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
#: Liger-Kernel's own defaults, used as they are (the issue compares against what users already have).
LIGER_SETTINGS = {"offset": 0.0, "casting_mode": "llama", "in_place": True}

#: Above this many elements the check runs on the device, chunk by chunk, under the same rule as
#: ``tolerances.compare`` (which copies to the CPU in float64: tens of seconds at 2**27 elements).
DEVICE_CHECK_MIN_NUMEL = 1 << 22


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


def _compare_on_device(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, chunk: int = 1 << 24) -> Check:
    """``tolerances.compare``'s rule and tolerances, applied in float64 on the tensors' device, in chunks."""
    tol = TOLERANCES[dtype or expected.dtype]
    if actual.shape != expected.shape:
        raise ValueError(f"compare: shapes differ, {tuple(actual.shape)} against {tuple(expected.shape)}")
    a_all, e_all = actual.detach().reshape(-1), expected.detach().reshape(-1)
    ok, max_abs, max_rel = True, 0.0, 0.0
    tiny = torch.finfo(torch.float64).tiny
    for start in range(0, a_all.numel(), chunk):
        a = a_all[start : start + chunk].to(torch.float64)
        e = e_all[start : start + chunk].to(torch.float64)
        inf_e = torch.isinf(e)
        same_nonfinite = (
            torch.equal(torch.isnan(a), torch.isnan(e)) and torch.equal(a[inf_e], e[inf_e]) and torch.equal(torch.isinf(a), inf_e)
        )
        finite = torch.isfinite(e) & torch.isfinite(a)
        d, ef = (a - e).abs()[finite], e.abs()[finite]
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float((d / ef.clamp_min(tiny)).max()))
        ok = ok and same_nonfinite and bool((d <= tol.atol + tol.rtol * ef).all())
    return Check(ok, max_abs, max_rel)


def check_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> Check:
    """``tolerances.compare`` itself for small tensors; its rule on the device for large ones."""
    if actual.numel() < DEVICE_CHECK_MIN_NUMEL or actual.device.type == "cpu":
        c = compare(actual, expected, dtype)
        return Check(c.ok, c.max_abs, c.max_rel)
    return _compare_on_device(actual, expected, dtype)


def check_outputs(mode: str, outputs: tuple, oracle: tuple, gamma_dtype: torch.dtype) -> Check:
    """Compare (y,) or (y, dx, dgamma) with the oracle's; the first failing output is named."""
    names = ("y", "dx", "dgamma")
    worst = Check(True, 0.0, 0.0)
    for name, got, want in zip(names, outputs, oracle):
        if got is None or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            got_desc = "None" if got is None else f"{tuple(got.shape)} {got.dtype}"
            return Check(False, math.inf, math.inf, f"{name}: got {got_desc}, expected {tuple(want.shape)} {want.dtype}")
        c = check_close(got, want, gamma_dtype if name == "dgamma" else None)
        worst = Check(worst.ok and c.ok, max(worst.max_abs, c.max_abs), max(worst.max_rel, c.max_rel), worst.detail)
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
    made again for each shape (see ``run_benchmark``)."""
    n_of = lambda x: (x.shape[-1],)  # noqa: E731
    if name == "triton":
        return lambda x, g: rmsnorm(x, g, EPS)
    if name == "reference":
        return lambda x, g: rmsnorm_reference(x, g, EPS)
    if name == "F.rms_norm":
        return lambda x, g: torch.nn.functional.rms_norm(x, n_of(x), g, EPS)
    if name == "compile":
        torch._dynamo.reset()  # a fresh cache for this shape: no recompile limit, no stale guards
        return torch.compile(lambda x, g: rmsnorm_reference(x, g, EPS), dynamic=False)
    if name == "liger":
        return _liger_fn() if device == "cuda" else None
    raise ValueError(f"benchmark: impl is {name!r}; accepted: {', '.join(IMPLS)}")


@torch.no_grad()
def oracle(x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dgamma) from the reference formulas evaluated in float64, rounded to the inputs' dtypes.

    float64 rather than the reference's float32 for float32 inputs: dgamma sums over up to 32768 rows,
    and a float32 sum of that length is itself off by about float32's declared tolerance, so a
    float32 oracle could fail an exact answer.
    """
    xd, gd, dyd = x.double(), gamma.double(), dy.double()
    y = rmsnorm_reference(xd, gd, EPS).to(x.dtype)
    dx, dgamma = manual_backward(xd, gd, dyd, EPS)
    return y, dx.to(x.dtype), dgamma.to(gamma.dtype)


def make_inputs(m: int, n: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    gamma = (1.0 + 0.5 * torch.randn(n, device=device, dtype=torch.float32, generator=g)).to(dtype)
    dy = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    return x, gamma, dy


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
    events_s: float | None  # median seconds per call, CUDA events over samples of `calls` calls
    do_bench_s: float | None  # triton.testing.do_bench median, seconds
    host_s: float | None = None  # median host seconds to issue one call (CPU side of the same samples)


Timer = Callable[[Callable[[], object]], Timing]


def cuda_timer(warmup: int = 20, samples: int = 50, calls: int = 20, do_bench: bool = True) -> Timer:
    def timer(fn: Callable[[], object]) -> Timing:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
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
        bench = None
        if do_bench:
            import triton.testing

            bench = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e3
        return Timing(statistics.median(per_call), bench, statistics.median(host))

    return timer


def no_timer(fn: Callable[[], object]) -> Timing:
    """The CPU smoke's timer: nothing is timed."""
    return Timing(None, None, None)


def copy_ceiling(device: str = "cuda", nbytes: int = 1 << 30, samples: int = 20, calls: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del src, dst
    return 2 * nbytes / statistics.median(times)


# --------------------------------------------------------------------------------------------------
# The run
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
    events_us: float | None = None
    do_bench_us: float | None = None
    host_us: float | None = None
    bandwidth_tbps: float | None = None
    pct_of_ceiling: float | None = None
    winner: bool = False
    speedup_vs_best_peer: float | None = None  # Triton rows: best OK peer's time / Triton's time


@dataclass
class Report:
    timed: bool
    device: str
    backend: str
    torch: str
    triton: str
    liger_kernel: str | None
    python: str
    date: str
    ceiling_tbps: float | None
    protocol: dict
    liger_settings: dict
    results: list[Result] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)
    host_breakdown: dict = field(default_factory=dict)


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def measure_row(m, n, dtype, mode, impl, fn, inputs, oracle, timer: Timer, ceiling_bps: float | None) -> Result:
    """Check one implementation on one problem, then time it (a failed check is not timed)."""
    x, gamma, dy = inputs
    nbytes = bytes_moved(mode, m, n, x.dtype, gamma.dtype)
    base = dict(shape=f"{m}x{n}", M=m, N=n, dtype=str(dtype).replace("torch.", ""), mode=mode, impl=impl, bytes=nbytes)
    # Liger's default in_place=True writes dx over dy: each implementation gets its own dy.
    own_dy = dy.clone()
    try:
        outputs = make_call(mode, fn, x, gamma, own_dy.clone())()
        check = check_outputs(mode, tuple(o.detach() if o is not None else None for o in outputs), oracle, gamma.dtype)
    except Exception as exc:  # an implementation that raises is a failed row, not a failed run
        return Result(**base, ok=False, detail=f"raised {type(exc).__name__}: {exc}"[:300], max_abs=None, max_rel=None)
    del outputs
    row = Result(**base, ok=check.ok, detail=check.detail, max_abs=check.max_abs, max_rel=check.max_rel)
    if not check.ok:
        return row
    timing = timer(make_call(mode, fn, x, gamma, own_dy))
    row.events_us, row.do_bench_us, row.host_us = _us(timing.events_s), _us(timing.do_bench_s), _us(timing.host_s)
    row.bandwidth_tbps = tbps(nbytes, timing.events_s)
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
    for m, n, dtype_name in shapes:
        dtype = _DTYPES[dtype_name]
        inputs = make_inputs(m, n, dtype, device)
        x, gamma, dy = inputs
        y_ref, dx_ref, dgamma_ref = oracle(x, gamma, dy)
        oracles = {FWD: (y_ref,), FWD_BWD: (y_ref, dx_ref, dgamma_ref)}
        for impl in impls:
            fn = impl_factory(impl, device)  # compile: a fresh compiled function for this shape
            if fn is None:
                log(f"  {impl}: not available here, skipped")
                continue
            for mode in MODES:
                t0 = time.perf_counter()
                row = measure_row(m, n, dtype, mode, impl, fn, inputs, oracles[mode], timer, ceiling_bps)
                results.append(row)
                status = "ok" if row.ok else f"FAILED: {row.detail}"
                timing = f"{row.events_us:.1f} us" if row.events_us is not None else "untimed"
                log(f"  {m}x{n} {dtype_name:8s} {mode:7s} {impl:10s} {timing:>12s}  {status}  ({time.perf_counter() - t0:.1f}s)")
        del inputs, x, gamma, dy, oracles, y_ref, dx_ref, dgamma_ref
        if device == "cuda":
            torch.cuda.empty_cache()
        if on_shape_done is not None:
            mark_winners(results)
            on_shape_done(results)
    mark_winners(results)
    return results


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(results: list[Result], ceiling_tbps: float | None) -> str:
    head = ("shape", "dtype", "mode", "impl", "events us", "do_bench us", "host us", "TB/s", "% ceil", "check", "")
    lines = []
    for r in results:
        check = "ok" if r.ok else "FAILED"
        mark = "best" if r.winner else ""
        if r.impl == "triton" and r.speedup_vs_best_peer is not None:
            mark = (mark + " " if mark else "") + f"x{r.speedup_vs_best_peer:.2f} vs best peer"
        lines.append((
            r.shape, r.dtype, r.mode, r.impl, _fmt(r.events_us, ".1f"), _fmt(r.do_bench_us, ".1f"), _fmt(r.host_us, ".1f"),
            _fmt(r.bandwidth_tbps, ".2f"), _fmt(r.pct_of_ceiling, ".0f"), check, mark,
        ))
    widths = [max(len(str(row[i])) for row in [head, *lines]) for i in range(len(head))]
    fmt_row = lambda row: "  ".join(str(c).ljust(w) if i in (0, 1, 2, 3, 9, 10) else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    out = [fmt_row(head), "  ".join("-" * w for w in widths)]
    previous = None
    for r, row in zip(results, lines):
        if previous is not None and (r.shape, r.dtype) != previous:
            out.append("")
        previous = (r.shape, r.dtype)
        out.append(fmt_row(row))
    ceiling = f"{ceiling_tbps:.2f} TB/s" if ceiling_tbps else "not measured"
    out.append(f"copy ceiling: {ceiling}; 'best': fastest correct row of its group (events median)")
    return "\n".join(out)


def write_json(report: Report, outputs: Path) -> Path:
    outputs = Path(outputs)
    outputs.mkdir(parents=True, exist_ok=True)
    path = outputs / "benchmark.json"
    data = asdict(report)
    path.write_text(json.dumps(data, indent=1, allow_nan=False, default=str))
    return path


def _versions() -> dict:
    import triton

    return dict(torch=torch.__version__, triton=triton.__version__, liger_kernel=liger_version(), python=platform.python_version())


def make_report(timed: bool, device_name: str, ceiling_bps: float | None, results: list[Result], args) -> Report:
    protocol = dict(
        warmup_calls=args.warmup, samples=args.samples, calls_per_sample=args.calls, statistic="median",
        do_bench="triton.testing.do_bench(warmup=10 ms, rep=40 ms) median" if not args.no_do_bench else "off",
        bytes="fwd: 2*M*N*x + N*gamma; fwd+bwd: 5*M*N*x + 2*N*gamma",
        eps=EPS, inputs="randn; gamma = 1 + 0.5 * randn", compile="torch.compile(reference, dynamic=False), dynamo reset per shape",
    )
    for r in results:  # JSON has no NaN or inf
        for k in ("max_abs", "max_rel"):
            v = getattr(r, k)
            if v is not None and not math.isfinite(v):
                setattr(r, k, None)
    return Report(
        timed=timed, device=device_name, backend=backend(), date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ceiling_tbps=None if ceiling_bps is None else ceiling_bps / 1e12, protocol=protocol, liger_settings=dict(LIGER_SETTINGS),
        results=results, **_versions(),
    )


# --------------------------------------------------------------------------------------------------
# Sweep of launch plans (GPU only): informs the tables in kernels.py
# --------------------------------------------------------------------------------------------------

def _table(**rows) -> dict:
    """kernels.WHOLE_ROW_TABLE with some BLOCK_N rows replaced: _table(r4096=(1, 16, 8))."""
    table = dict(kernels.WHOLE_ROW_TABLE)
    table.update({int(k[1:]): v for k, v in rows.items()})
    return {"WHOLE_ROW_TABLE": table}


def _loop(chunk: int, warps: int) -> dict:
    """kernels.LOOP_TABLE with every entry replaced by one (chunk, warps)."""
    return {"LOOP_TABLE": {k: (chunk, warps) for k in kernels.LOOP_TABLE}}


SWEEP_VARIANTS: dict[str, dict] = {
    "base": {},
    "base_again": {},  # the same plan timed again: the run-to-run noise of the sweep
    "single_off": {"SINGLE_PROGRAM_MAX_ELEMENTS": 0},
    "single_8192w16": {"SINGLE_TILE_ELEMENTS": 8192, "SINGLE_WARPS": 16},
    # Whole rows, forward: warps, persistent programs and pipelining depth (aligned rows, then rows that
    # start off a 16-byte boundary).
    "fwd_whole_rows": {"FWD_CHUNKED_ROWS": {}},
    "fwd_whole_rows_pps2_s3": {"FWD_CHUNKED_ROWS": {}, "FWD_PROGRAMS_PER_SM": 2, "FWD_STAGES": 3},
    "unaligned_one_per_tile": {"UNALIGNED_FWD_PROGRAMS_PER_SM": 0, "UNALIGNED_FWD_STAGES": 1},
    "unaligned_pps1_s3": {"UNALIGNED_FWD_PROGRAMS_PER_SM": 1, "UNALIGNED_FWD_STAGES": 3},
    "unaligned_pps2_s3": {"UNALIGNED_FWD_PROGRAMS_PER_SM": 2, "UNALIGNED_FWD_STAGES": 3},
    "unaligned_pps4_s2": {"UNALIGNED_FWD_PROGRAMS_PER_SM": 4, "UNALIGNED_FWD_STAGES": 2},
    # Whole rows, backward: pipelining depth, programs per multiprocessor, warps.
    "bwd_s1": {"BWD_STAGES": 1},
    "bwd_s2": {"BWD_STAGES": 2},
    "bwd_s4": {"BWD_STAGES": 4},
    "bwd_s3_pps2": {"BWD_STAGES": 3, "PROGRAMS_PER_SM": 2},
    "bwd4096w8": _table(r4096=(1, 8, 8)),
    "bwd4096w32": _table(r4096=(1, 8, 32)),
    "bwd8192w32": _table(r8192=(1, 8, 32)),
    # Looped rows: the backward's pipelining depth; the forward's chunk, warps and depth; chunking of the
    # backward's two steps.
    "loop_s1": {"LOOP_STAGES": 1},
    "loop_s2": {"LOOP_STAGES": 2},
    "loop_s4": {"LOOP_STAGES": 4},
    "loop_fwd_8192w8_s3": {**_loop(8192, 8), "LOOP_FWD_STAGES": 3},
    "loop_fwd_4096w16": _loop(4096, 16),
    "loop_fwd_8192w16": _loop(8192, 16),
    "loop_fwd_8192w32": _loop(8192, 32),
    "loop_fwd_16384w32": _loop(16384, 32),
    "stats4096w8": {"STATS_BLOCK_N": 4096, "STATS_WARPS": 8},
    "seg4096m1w16": {"SEG_BLOCK_N": 4096, "SEG_BLOCK_M": 1, "SEG_WARPS": 16},
    "segpps1": {"SEG_PROGRAMS_PER_SM": 1},
    "segpps4": {"SEG_PROGRAMS_PER_SM": 4},
}
SWEEP_SHAPES: dict[tuple[int, int, str], tuple[str, ...]] = {
    (128, 257, "float32"): ("base", "single_off", "single_8192w16"),
    (4096, 4096, "bfloat16"): ("base", "base_again", "bwd_s1"),
    (32768, 4096, "float32"): ("base", "base_again", "fwd_whole_rows", "fwd_whole_rows_pps2_s3", "bwd_s1", "bwd_s2", "bwd_s4",
                               "bwd_s3_pps2", "bwd4096w8", "bwd4096w32"),
    (16384, 8192, "bfloat16"): ("base", "base_again", "fwd_whole_rows", "fwd_whole_rows_pps2_s3", "bwd_s1", "bwd_s2", "bwd_s4",
                                "bwd_s3_pps2", "bwd8192w32"),
    (8192, 4097, "float16"): ("base", "base_again", "unaligned_one_per_tile", "unaligned_pps1_s3", "unaligned_pps2_s3",
                              "unaligned_pps4_s2", "bwd_s1", "bwd_s3_pps2", "bwd8192w32"),
    (4096, 32768, "bfloat16"): ("base", "base_again", "loop_s1", "loop_s2", "loop_s4", "loop_fwd_8192w8_s3",
                                "loop_fwd_4096w16", "loop_fwd_8192w16", "stats4096w8", "seg4096m1w16", "segpps1", "segpps4"),
    (2048, 65536, "bfloat16"): ("base", "base_again", "loop_s1", "loop_s2", "loop_s4", "loop_fwd_8192w8_s3",
                                "loop_fwd_4096w16", "loop_fwd_8192w16", "loop_fwd_8192w32", "loop_fwd_16384w32", "stats4096w8",
                                "seg4096m1w16", "segpps1", "segpps4"),
}


@contextlib.contextmanager
def plan_overrides(**overrides):
    """Temporarily change the constants ``kernels.plan`` reads (and forget the plans made meanwhile)."""
    saved = {k: getattr(kernels, k) for k in overrides}
    try:
        for k, v in overrides.items():
            setattr(kernels, k, v)
        kernels.plan.cache_clear()
        yield
    finally:
        for k, v in saved.items():
            setattr(kernels, k, v)
        kernels.plan.cache_clear()


def run_sweep(device: str, timer: Timer, ceiling_bps: float | None, log=print) -> list[dict]:
    rows = []
    fn = make_impl("triton", device)
    for (m, n, dtype_name), variants in SWEEP_SHAPES.items():
        dtype = _DTYPES[dtype_name]
        inputs = make_inputs(m, n, dtype, device)
        x, gamma, dy = inputs
        expected = oracle(x, gamma, dy)
        for name in variants:
            with plan_overrides(**SWEEP_VARIANTS[name]):
                p = kernels.plan_for(x, gamma)
                for mode in MODES:
                    r = measure_row(m, n, dtype, mode, "triton", fn, inputs, expected[: 1 if mode == FWD else 3], timer, ceiling_bps)
                    rows.append(dict(variant=name, plan=str(p), **asdict(r)))
                    log(f"  sweep {m}x{n} {dtype_name:8s} {mode:7s} {name:12s} {_fmt(r.events_us, '.1f'):>9s} us "
                        f"{_fmt(r.do_bench_us, '.1f'):>9s} us(do_bench) {_fmt(r.pct_of_ceiling, '.0f'):>4s}%  {'ok' if r.ok else 'FAILED ' + r.detail}")
        del inputs, x, gamma, dy, expected
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------
# Where the host time of a small call goes (GPU only)
# --------------------------------------------------------------------------------------------------


def host_breakdown(device: str = "cuda", m: int = 128, n: int = 257, calls: int = 300, warmup: int = 20) -> dict[str, float]:
    """Host microseconds per call of the pieces of the Triton path at a small shape, and of F.rms_norm.

    Each piece is issued ``calls`` times back to back and timed on the host clock, with one synchronize
    at the end: at this size the GPU finishes long before the host issues the next call.
    """
    x, gamma, dy = make_inputs(m, n, torch.float32, device)
    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    p = kernels.plan_for(x, gamma)
    y = torch.empty_like(x)
    fwd_args = (x, gamma, y, m, n, n, n, EPS)
    fwd_key = (x.get_device(), x.dtype, gamma.dtype, m, n, n, *kernels._address_key(x, gamma, y))
    fwd_meta = (("BLOCK_M", p.fwd_block_m), ("BLOCK_N", p.block_n), ("STAGES", p.fwd_stages))

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.view_as(a)

        @staticmethod
        def backward(ctx, g):
            return g

    class TwoInputs(torch.autograd.Function):
        """rmsnorm's autograd shape (x, gamma, eps in; y out; dx, dgamma back) with only the allocations."""

        @staticmethod
        def forward(ctx, a, b, eps):
            ctx.save_for_backward(a, b)
            ctx.eps = eps
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return torch.empty_like(a), torch.empty_like(b), None

    pieces: dict[str, Callable[[], object]] = {
        "triton JIT launch (fwd kernel)": lambda: kernels._rmsnorm_fwd_kernel[(p.fwd_programs,)](
            *fwd_args, **dict(fwd_meta), num_warps=p.fwd_warps),
        "kernels._launch (fwd kernel)": lambda: kernels._launch(kernels._rmsnorm_fwd_kernel, (p.fwd_programs,), fwd_args, fwd_meta,
                                                               p.fwd_warps, fwd_key),
        "contract.check_forward": lambda: check_forward(x, gamma, EPS),
        "torch.empty": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "kernels.rmsnorm_forward": lambda: kernels.rmsnorm_forward(x, gamma, EPS),
        "kernels.rmsnorm_backward": lambda: kernels.rmsnorm_backward(dy, x, gamma, EPS),
        "rmsnorm fwd": lambda: rmsnorm(x, gamma, EPS),
        "autograd.grad of a Python identity Function": lambda: torch.autograd.grad(Identity.apply(xl), (xl,), dy),
        "autograd.grad of a two-input Python Function": lambda: torch.autograd.grad(TwoInputs.apply(xl, gl, EPS), (xl, gl), dy),
        "autograd.grad of x * gamma (C++ autograd)": lambda: torch.autograd.grad(xl * gl, (xl, gl), dy),
        "rmsnorm fwd+bwd": lambda: torch.autograd.grad(rmsnorm(xl, gl, EPS), (xl, gl), dy),
        "rmsnorm fwd+bwd, Python route": lambda: torch.autograd.grad(_RMSNormFunction.apply(xl, gl, EPS), (xl, gl), dy),
        "native.apply fwd (C++ route)": lambda: native.apply(x, gamma, EPS),
        "F.rms_norm fwd": lambda: torch.nn.functional.rms_norm(x, (n,), gamma, EPS),
        "F.rms_norm fwd+bwd": lambda: torch.autograd.grad(torch.nn.functional.rms_norm(xl, (n,), gl, EPS), (xl, gl), dy),
    }
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, fn in pieces.items():
        for _ in range(warmup):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) / calls
        sync()
        out[name] = host * 1e6
    return out


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", choices=("full", "small"), default="full",
                        help="full: the issue's nine shapes (default); small: 128x257, 32x257 float32 and 4096x4096 float16")
    parser.add_argument("--quick", action="store_true", help="small shapes and 10 samples instead of 50: a fast look, not a result")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    parser.add_argument("--outputs", type=Path, default=Path("outputs"), help="directory for benchmark.json (default: outputs)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up calls before timing (default 20)")
    parser.add_argument("--samples", type=int, default=50, help="timed samples (default 50)")
    parser.add_argument("--calls", type=int, default=20, help="calls per sample (default 20)")
    parser.add_argument("--no-do-bench", action="store_true", help="skip triton.testing.do_bench")
    parser.add_argument("--sweep", action="store_true", help="also time the Triton path under alternative launch plans")
    parser.add_argument("--sweep-only", action="store_true",
                        help="only the launch-plan sweep (plus Triton and F.rms_norm at the two small shapes): a tuning run, not a result")
    parser.add_argument("--require-gpu", action="store_true", help="without a CUDA GPU exit 2 instead of running the CPU smoke")


def _parse_impls(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in IMPLS]
    if unknown:
        raise SystemExit(f"benchmark: unknown --impls {', '.join(unknown)}; accepted: {', '.join(IMPLS)}")
    return names


def run(args) -> int:
    impls = _parse_impls(args.impls)
    if args.quick:
        args.samples = min(args.samples, 10)
    shapes = SMALL_SHAPES if (args.shapes == "small" or args.quick) else FULL_SHAPES
    if backend() != CUDA:
        print("benchmark: no CUDA GPU here, so nothing can be timed (timings need a CUDA GPU).", file=sys.stderr)
        if args.require_gpu:
            return 2
        print("benchmark: running a correctness-only smoke instead: tiny shapes through Triton's interpreter, "
              "checked against the oracle, no timings.", file=sys.stderr)
        impls = [i for i in impls if i not in ("compile", "liger")]
        results = run_benchmark(CPU_SMOKE_SHAPES, impls, "cpu", no_timer, None)
        report = make_report(False, platform.processor() or "cpu", None, results, args)
        path = write_json(report, args.outputs)
        print(f"\nwrote {path}\n")
        print(format_table(results, None))
        print("CPU smoke: correctness only, no timings (run on a CUDA GPU for the benchmark).")
        return 0 if all(r.ok for r in results) else 1

    device_name = torch.cuda.get_device_name()
    versions = _versions()
    print(f"benchmark on {device_name}: torch {versions['torch']}, triton {versions['triton']}, liger-kernel {versions['liger_kernel']}")
    ceiling = copy_ceiling()
    print(f"device-to-device copy ceiling: {ceiling / 1e12:.2f} TB/s")
    timer = cuda_timer(args.warmup, args.samples, args.calls, do_bench=not args.no_do_bench)
    if args.sweep_only:
        shapes, impls = FULL_SHAPES[:2], [i for i in impls if i in ("triton", "F.rms_norm")]
    breakdown = host_breakdown()
    print(f"host time per call at 128x257 float32 (fast launch {'on' if kernels.FAST_LAUNCH else 'off'}):")
    for name, us in breakdown.items():
        print(f"  {name:48s} {us:8.1f} us")

    def finish(rows) -> Report:
        report = make_report(True, device_name, ceiling, list(rows), args)
        report.host_breakdown = breakdown
        report.protocol["fast_launch"] = kernels.FAST_LAUNCH
        return report

    # The JSON is rewritten after every shape, so a run cut short still leaves what it measured.
    results = run_benchmark(shapes, impls, "cuda", timer, ceiling, on_shape_done=lambda rows: write_json(finish(rows), args.outputs))
    report = finish(results)
    if args.sweep or args.sweep_only:
        report.sweep = run_sweep("cuda", cuda_timer(10, 20, 10, do_bench=False), ceiling)
        print("\nsweep (Triton path under alternative launch plans; events median, 20 samples of 10 calls):")
        for r in report.sweep:
            print(f"  {r['shape']:>11s} {r['dtype']:8s} {r['mode']:7s} {r['variant']:16s} {_fmt(r['events_us'], '.1f'):>9s} us "
                  f"{_fmt(r['bandwidth_tbps'], '.2f'):>5s} TB/s {_fmt(r['pct_of_ceiling'], '.0f'):>4s}%  {'ok' if r['ok'] else 'FAILED'}")
    path = write_json(report, args.outputs)
    print(f"\nwrote {path}\n")
    print(f"{device_name}, torch {versions['torch']}, triton {versions['triton']}, liger-kernel {versions['liger_kernel']}, {report.date}")
    print(format_table(results, ceiling / 1e12))
    # A peer outside the oracle's tolerance is a finding, reported in its row; a wrong Triton row fails the run.
    return 0 if all(r.ok for r in results if r.impl == "triton") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmsnorm_kernel.benchmark", description=__doc__.strip().split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
