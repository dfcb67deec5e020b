"""Checking and timing one point of the sweep: the oracle on the checked rows, the two times, the ceiling.

Every implementation runs forward alone and forward + backward at every point, through
``rows.measure_row``: first checked against the float64 oracle (``ops.reference.oracle``)
with ``ops.tolerances.compare``, on every row when x has at most ``FULL_CHECK_ELEMENTS`` elements; above
that on the first and last ``CHECK_EDGE_ROWS`` rows and ``CHECK_SPREAD_ROWS`` spread between for y and
dx, and dgamma over all rows, summed in float64 chunk by chunk (``expected_outputs``). A wrong result is
not timed. Two times per call then (``CudaTimers``):

- **whole call**: CUDA events around back-to-back eager calls, allocations, autograd and host work
  included, as the benchmark times them (``timing.event_samples``); the median over
  samples (3 to 10 samples of 1 to 20 calls, about 20 ms in all), with the host time to issue a call;
- **GPU time**: the same call captured in a CUDA graph (``torch.cuda.CUDAGraph``, after warm-up calls on
  a side stream; ``torch.compile``'s function after its compilation), its replays timed by
  ``triton.testing.do_bench`` (median, L2 flushed before each replay). A replay runs the call's kernels
  with no Python, launcher, autograd or allocator work between them, the same way for every
  implementation, so host work neither hides nor adds GPU time; it still counts the gaps between the
  call's kernels, which a training step also pays. The graph's replay is checked against the oracle once
  more. Where a call cannot be captured, or its replay is wrong, the GPU time is the sum of the call's
  kernel (and memcpy/memset) durations in ``torch.profiler``'s records (median of ``PROFILER_CALLS``
  calls, L2 flushed before each): it leaves out the gaps between kernels. Each row names its method
  (``gpu_method``).

Bandwidth is the byte model of ``rows.bytes_moved`` over the time. The copy ceiling
(``measure_ceiling``) is a device-to-device ``copy_`` of each regime's bytes (bytes read plus written),
at the start and at the end of each run, as a whole call and by ``do_bench`` of the copy kernel; a row's
share of the ceiling uses its regime's fastest copy (``best_ceilings``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import triton.testing

from rmsnorm_kernel.checks.report import one_line
from rmsnorm_kernel.ops.reference import manual_backward, oracle
from rmsnorm_kernel.testing import make_inputs

from ..impls import DTYPES, EPS, LIGER_SETTINGS, MODES, make_impl
from ..rows import Result, measure_row, tbps
from ..timing import Timer, Timing, event_samples
from .points import Point

MiB = 1 << 20

#: What one row's timing spends: whole calls for about WHOLE_BUDGET_S (at least WHOLE_MIN_SAMPLES samples),
#: do_bench's warm-up and repetitions in ms of replays, the profiler's calls when there is no graph.
WHOLE_BUDGET_S = 0.02
WHOLE_MAX_SAMPLES, WHOLE_MIN_SAMPLES, WHOLE_MAX_CALLS = 10, 3, 20
GPU_REP_MS, GPU_WARMUP_MS = 15, 5
GRAPH_WARMUP_CALLS = 3
PROFILER_CALLS = 5

# --------------------------------------------------------------------------------------------------
# The oracle, on the rows that are checked
# --------------------------------------------------------------------------------------------------

FULL_CHECK_ELEMENTS = 1 << 24
CHECK_EDGE_ROWS, CHECK_SPREAD_ROWS = 64, 128
DGAMMA_CHUNK_ELEMENTS = 1 << 24


def check_rows(m: int, n: int, full_limit: int = FULL_CHECK_ELEMENTS) -> list[int] | None:
    """The rows whose y and dx are checked: all (None) up to ``full_limit`` elements, else the first and
    last ``CHECK_EDGE_ROWS`` and ``CHECK_SPREAD_ROWS`` spread between (the tail tiles and many programs)."""
    if m * n <= full_limit:
        return None
    spread = {round(i * (m - 1) / (CHECK_SPREAD_ROWS - 1)) for i in range(CHECK_SPREAD_ROWS)}
    edges = {*range(min(m, CHECK_EDGE_ROWS)), *range(max(0, m - CHECK_EDGE_ROWS), m)}
    return sorted(spread | edges)


def expected_outputs(
    x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, rows: list[int] | None, eps: float = EPS
) -> tuple:
    """(y, dx, dgamma) of the oracle: on every row (``rows`` None), or y and dx on ``rows`` only, with
    dgamma over all rows, the oracle's float64 formula summed chunk by chunk (no float64 copy of x)."""
    if rows is None:
        return oracle(x, gamma, dy, eps)
    idx = torch.tensor(rows, device=x.device)
    y, dx, _ = oracle(x.index_select(0, idx), gamma, dy.index_select(0, idx), eps)
    m, n = x.shape
    step = max(1, DGAMMA_CHUNK_ELEMENTS // n)
    acc = torch.zeros(n, dtype=torch.float64, device=x.device)
    gd = gamma.double()
    with torch.no_grad():
        for s in range(0, m, step):
            acc += manual_backward(x[s : s + step].double(), gd, dy[s : s + step].double(), eps)[1]
    return y, dx, acc.to(gamma.dtype)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------

GRAPH, PROFILER = "cuda-graph", "profiler"


class CudaTimers:
    """The two times of the module docstring, on the current CUDA device: a timer for
    ``rows.measure_row``."""

    def __init__(self, whole_s: float = WHOLE_BUDGET_S, rep_ms: int = GPU_REP_MS, warmup_ms: int = GPU_WARMUP_MS):
        self.whole_s, self.rep_ms, self.warmup_ms = whole_s, rep_ms, warmup_ms
        self._side: torch.cuda.Stream | None = None

    def __call__(self, call, restore, verify) -> Timing:
        events_s, host_s = self.whole(call)
        restore()
        gpu_s, method, note = self.gpu(call, restore, verify)
        return Timing(events_s, gpu_s, host_s, method, note)

    def whole(self, call: Callable[[], object]) -> tuple[float, float]:
        """(median seconds per call by CUDA events, median host seconds to issue one call), the samples
        sized from one call's time."""
        call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        t1 = max(start.elapsed_time(end) / 1e3, 1e-7)
        calls = min(WHOLE_MAX_CALLS, max(1, int(self.whole_s / WHOLE_MAX_SAMPLES / t1)))
        samples = min(WHOLE_MAX_SAMPLES, max(WHOLE_MIN_SAMPLES, int(self.whole_s / (calls * t1))))
        return event_samples(call, samples, calls)

    def gpu(self, call: Callable[[], object], restore: Callable[[], object], verify: Callable[[object], str | None]):
        """(seconds, method, note): replays of ``call`` captured in a CUDA graph, or the profiler's kernel
        records when it cannot be captured or its replay is wrong. ``restore`` puts back the inputs a
        call overwrites (Liger writes dx over dy); ``verify`` checks a replay's outputs (None: right)."""
        try:
            seconds, problem = self._graph(call, restore, verify)
            if problem is None:
                return seconds, GRAPH, ""
            note = f"the CUDA graph's replay is wrong ({problem}); timed from the profiler"
        except Exception as exc:  # capture refused: a host sync, an allocation the graph cannot hold...
            note = f"no CUDA graph ({one_line(exc)[:200]}); timed from the profiler"
        torch.cuda.synchronize()
        restore()
        return self._profiler(call), PROFILER, note

    def _graph(self, call, restore, verify) -> tuple[float, str | None]:
        if self._side is None:
            self._side = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):  # warm-up off the default stream, as graph capture requires
            for _ in range(GRAPH_WARMUP_CALLS):
                call()
        main.wait_stream(self._side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        static = None
        # The outer stream context puts the current stream back even when a failed capture's exit raises
        # before torch.cuda.graph restores it.
        with torch.cuda.stream(main):
            try:
                with torch.cuda.graph(graph):
                    static = call()
                ms = triton.testing.do_bench(graph.replay, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
                restore()
                graph.replay()
                torch.cuda.synchronize()
                return ms / 1e3, verify(static)
            finally:
                del static
                try:
                    graph.reset()
                except Exception:  # a capture that failed half-way may leave nothing to reset
                    pass

    def _profiler(self, call) -> float:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        flush = torch.empty(256 * MiB, dtype=torch.int8, device="cuda")
        times = []
        for _ in range(PROFILER_CALLS):
            flush.zero_()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            times.append(sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e6)
        return statistics.median(times)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def measure_ceiling(regime: str, nbytes: int, timers: CudaTimers, when: str) -> dict:
    """A device-to-device copy of ``nbytes``, timed both ways; moved bytes = read + written.

    Its GPU time is ``do_bench`` of the copy itself, not of a CUDA graph: captured in a graph, ``copy_``
    becomes a memcpy node that the copy engines run, slower than the copy kernel. One copy of 32 MiB or
    more has no host work worth removing.
    """
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    whole_s, _ = timers.whole(lambda: dst.copy_(src))
    gpu_s = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e3
    moved = 2 * nbytes
    return dict(
        regime=regime,
        when=when,
        bytes=moved,
        whole_us=_us(whole_s),
        gpu_us=_us(gpu_s),
        gpu_method="do_bench",
        gpu_note="the copy kernel itself (a graph would run a memcpy node on the copy engines)",
        whole_tbps=tbps(moved, whole_s),
        gpu_tbps=tbps(moved, gpu_s),
    )


# --------------------------------------------------------------------------------------------------
# Measuring a point
# --------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One implementation in one direction at one point, as a run's file holds it."""

    point: str
    regime: str
    origin: str
    split: str
    M: int
    N: int
    dtype: str
    mode: str
    impl: str
    bytes: int
    repeat: int = 0  # 0: the point's measurement; 1: a noise repeat at the end of a run
    ok: bool = False
    detail: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    checked_rows: int | None = None  # rows of y and dx compared with the oracle (dgamma: always all)
    whole_us: float | None = None
    host_us: float | None = None
    gpu_us: float | None = None
    gpu_method: str | None = None
    gpu_note: str = ""
    whole_tbps: float | None = None
    gpu_tbps: float | None = None
    ceiling_tbps: float | None = None
    pct_of_ceiling: float | None = None
    first_call_s: float | None = None  # the checked first call: compiles and Triton JIT land here
    measure_s: float | None = None
    session: int = 0  # index of the run (its file) in a merged file

    @classmethod
    def of(cls, point: Point, r: Result, repeat: int = 0, measure_s: float | None = None) -> Row:
        """The sweep's record of ``rows.measure_row``'s result at ``point``."""
        return cls(
            point=point.id,
            regime=point.regime,
            origin=point.origin,
            split=point.split,
            M=point.M,
            N=point.N,
            dtype=point.dtype,
            mode=r.mode,
            impl=r.impl,
            bytes=r.bytes,
            repeat=repeat,
            ok=r.ok,
            detail=r.detail,
            max_abs=r.max_abs,
            max_rel=r.max_rel,
            checked_rows=r.checked_rows,
            whole_us=r.events_us,
            host_us=r.host_us,
            gpu_us=r.gpu_us,
            gpu_method=r.gpu_method,
            gpu_note=r.gpu_note,
            whole_tbps=r.bandwidth_tbps,
            gpu_tbps=r.gpu_tbps,
            first_call_s=r.first_call_s,
            measure_s=measure_s,
        )


def measure_point(
    point: Point,
    impls: Sequence[str],
    device: str,
    timer: Timer,
    repeat: int = 0,
    impl_factory: Callable = make_impl,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """Every implementation of ``impls`` in both directions at ``point``, checked then timed by ``timer``."""
    inputs = make_inputs((point.M, point.N), DTYPES[point.dtype], device)
    rows_checked = check_rows(point.M, point.N)
    expected = expected_outputs(*inputs, rows_checked)
    results = []
    for impl in impls:
        fn = impl_factory(impl, device)  # compile: a fresh compiled function for this point
        if fn is None:
            log(f"  {impl}: not available here, skipped")
            continue
        for mode in MODES:
            t0 = time.perf_counter()
            result = measure_row(mode, impl, fn, inputs, expected, timer, rows=rows_checked)
            row = Row.of(point, result, repeat, time.perf_counter() - t0)
            results.append(row)
            status = "ok" if row.ok else f"FAILED: {row.detail}"
            times = (
                "untimed"
                if row.gpu_us is None
                else f"whole {row.whole_us:9.1f} us  GPU {row.gpu_us:9.1f} us ({row.gpu_method})"
            )
            log(f"  {point.id:26s} {mode:7s} {impl:10s} {times}  {status}  ({row.first_call_s or 0:.1f}s first call)")
            if row.gpu_note:
                log(f"    note: {row.gpu_note}")
        del fn
    del inputs, expected
    if device == "cuda":
        torch.cuda.empty_cache()
    return results


# --------------------------------------------------------------------------------------------------
# The copy ceiling a row is measured against
# --------------------------------------------------------------------------------------------------


def ceiling_tbps(c: dict) -> float:
    """One copy measurement's speed: the faster of its two times, each a speed the copy reached."""
    return max(c.get("gpu_tbps") or 0.0, c.get("whole_tbps") or 0.0)


def best_ceilings(ceilings: Iterable[dict]) -> dict[str, float]:
    """Each regime's copy ceiling: the fastest of its copy measurements."""
    best: dict[str, float] = {}
    for c in ceilings:
        if ceiling_tbps(c):
            best[c["regime"]] = max(best.get(c["regime"], 0.0), ceiling_tbps(c))
    return best


def apply_ceilings(rows: Iterable[Row], ceilings: Iterable[dict]) -> None:
    """Each row's share of its regime's copy ceiling (``best_ceilings``), by GPU time."""
    best = best_ceilings(ceilings)
    for r in rows:
        r.ceiling_tbps = best.get(r.regime)
        r.pct_of_ceiling = 100.0 * r.gpu_tbps / r.ceiling_tbps if r.gpu_tbps and r.ceiling_tbps else None


def protocol(whole_s: float = WHOLE_BUDGET_S, rep_ms: int = GPU_REP_MS) -> dict:
    """The protocol above in words, for the run's file."""
    return dict(
        whole_call=f"CUDA events around back-to-back eager calls, median of {WHOLE_MIN_SAMPLES}-{WHOLE_MAX_SAMPLES} "
        f"samples of 1-{WHOLE_MAX_CALLS} calls (about {whole_s * 1e3:g} ms); host time beside it",
        gpu_time=f"CUDA graph of the call ({GRAPH_WARMUP_CALLS} warm-up calls on a side stream first), replays "
        f"timed by triton.testing.do_bench(warmup={GPU_WARMUP_MS} ms, rep={rep_ms} ms, median, L2 flushed); "
        f"fallback: torch.profiler kernel durations summed, median of {PROFILER_CALLS} calls, L2 flushed",
        bytes="benchmarks.rows.bytes_moved: fwd 2*M*N*x + N*gamma; fwd+bwd 5*M*N*x + 2*N*gamma",
        ceiling="device-to-device copy_ of each regime's bytes at the start and end of each run, as a whole call "
        "and by do_bench; a row uses its regime's fastest",
        check=f"ops.tolerances.compare against ops.reference.oracle (float64); above {FULL_CHECK_ELEMENTS} "
        f"elements y and dx on {2 * CHECK_EDGE_ROWS + CHECK_SPREAD_ROWS} rows at most, dgamma always whole; "
        "the graph's replay checked again",
        compile="torch.compile(reference, dynamic=False), torch.compiler.reset() before each point: "
        "two graphs per point",
        liger_settings=dict(LIGER_SETTINGS),
        eps=EPS,
        inputs="rmsnorm_kernel.testing.make_inputs, seed 0",
    )
