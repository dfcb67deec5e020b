"""Time the Triton RMSNorm against its peers on one GPU, in one run, on the same inputs.

Run from the repository root as ``python -m benchmarks.benchmark [options]``. For each shape and dtype,
forward alone and forward + backward through autograd, for the Triton path (``rmsnorm``) and every peer
of ``impls.IMPLS``: the eager reference, ``torch.nn.functional.rms_norm``, ``torch.compile`` of the
reference (compiled afresh for each shape with ``dynamic=False``: ``torch.compiler.reset()`` between
shapes, so no recompile limit ever sends it back to eager code) and Liger-Kernel's
``LigerRMSNormFunction`` when it can be imported.

Protocol, as in Triton's tutorial:
- the machine's device-to-device copy bandwidth is measured first (a 1 GiB ``copy_``, bytes read plus
  bytes written, ``timing.copy_ceiling``): it is the ceiling every result is also reported against;
- inputs come from ``rmsnorm_kernel.testing.make_inputs`` (random, never zeros);
- every implementation's outputs (y; y, dx and dgamma) are checked against ``ops.reference.oracle``
  with ``ops.tolerances.compare`` in the same run (``rows.measure_row``); a wrong result marks the row
  failed, it is not timed and it can win nothing;
- CUDA events around whole calls (allocations and autograd included): 20 warm-up calls, then 50
  samples of 20 calls, the median sample divided by 20; ``triton.testing.do_bench``'s median is
  reported beside it, and the host time to issue a call (``time.perf_counter`` over the same samples)
  (``timing.cuda_timer``);
- bytes are the fewest the operation must move (``rows.bytes_moved``): forward 2*M*N elements of x's
  dtype + N of gamma's; forward + backward 5*M*N (x and y; x, dy and dx) + 2*N (gamma, dgamma);
- a table is printed last (``tables.table``) and every number goes to ``<outputs>/benchmark.json``
  (``report.write_report``; an earlier run's file there is kept as ``benchmark.json.prev<n>``), rewritten
  after every shape; at the end the figure
  ``<outputs>/figures/benchmark.png`` is drawn from that file (``figures.benchmark_figure``).

Without a CUDA GPU nothing can be timed: the command says so, runs a tiny correctness-only smoke of
the implementations that run on the CPU (the Triton path through Triton's interpreter, the reference,
``F.rms_norm``), writes the JSON with no timings (the figure is skipped), and exits 0 when every result
is right, 1 otherwise (``--require-gpu`` makes it exit 2 instead of running the smoke). A usage mistake
exits 2 with one line.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from rmsnorm_kernel import tables
from rmsnorm_kernel.checks.report import one_line, outputs_problem, report_path, write_report
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import oracle
from rmsnorm_kernel.testing import make_inputs

from .common import OneLineParser, at_least, exit_status, keep_earlier_run, run_interruptible
from .figures import FIGURE, benchmark_figure
from .impls import DTYPES, EPS, IMPLS, LIGER_SETTINGS, MODES, ForwardFn, make_impl, parse_impls, versions, without_gpu
from .rows import Result, mark_winners, measure_row
from .timing import Timer, copy_ceiling, cuda_timer, no_timer

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
# Output: the table (tables.table), the JSON report (report.write_report) and the figure

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
    text = tables.table(TABLE_HEAD, rows, right=range(4, 9), groups=[(r.shape, r.dtype) for r in results])
    ceiling = f"{ceiling_tbps:.2f} TB/s" if ceiling_tbps else "not measured"
    return text + f"\ncopy ceiling: {ceiling}; 'best': fastest correct row of its group (events median)"


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


def draw_figure(json_path: Path, outputs: Path) -> str:
    """``<outputs>/figures/benchmark.png`` from the JSON just written, as one line to print. A figure that
    cannot be drawn is reported in that line; it never changes the command's exit status."""
    out = outputs / "figures" / FIGURE
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        result = benchmark_figure(json_path, out)
    except Exception as exc:  # a drawing bug must not hide the results
        return f"figure {out}: failed ({one_line(exc)})"
    return f"figure {out}: {result.status} ({result.detail})"


# --------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m benchmarks.benchmark", description=__doc__.strip().split("\n")[0])
    parser.add_argument(
        "--shapes",
        choices=("full", "small"),
        default="full",
        help="full: the nine shapes of FULL_SHAPES (default); small: 128x257, 32x257 float32 and 4096x4096 float16",
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
    return parser


def _cpu_smoke(impls: list[str], args) -> int:
    results = run_benchmark(CPU_SMOKE_SHAPES, impls, "cpu", no_timer, None)
    path = write(args.outputs, False, platform.processor() or "cpu", None, results, args)
    print(f"\nwrote {path}\n{draw_figure(path, args.outputs)}\n")
    print(table(results, None))
    print("CPU smoke: correctness only, no timings (run on a CUDA GPU for the benchmark).")
    return exit_status("benchmark", sum(not r.ok for r in results), "row(s) off the oracle (the table above)")


def run(args) -> int:
    """The command, on arguments parsed by ``build_parser``."""
    impls = args.impls
    if args.quick:
        args.samples = min(args.samples, 10)
    shapes = SMALL_SHAPES if (args.shapes == "small" or args.quick) else FULL_SHAPES
    gpu = backend() == CUDA
    no_gpu = "benchmark: no CUDA GPU here, so nothing can be timed (timings need a CUDA GPU)."
    if not gpu:
        if args.require_gpu:
            print(no_gpu, file=sys.stderr)
            return 2
        try:
            impls = without_gpu(impls)
        except ValueError as e:
            print(f"benchmark: {e}", file=sys.stderr)
            return 2
    problem = outputs_problem(args.outputs)  # last: it makes the folder
    if problem is not None:
        print(f"benchmark: {problem}", file=sys.stderr)
        return 2
    if not gpu:
        print(no_gpu, file=sys.stderr)
        print(
            "benchmark: running a correctness-only smoke instead: tiny shapes through Triton's interpreter, "
            "checked against the oracle, no timings.",
            file=sys.stderr,
        )
        keep_earlier_run("benchmark", report_path(args.outputs, "benchmark"))
        return _cpu_smoke(impls, args)

    device_name = torch.cuda.get_device_name()
    v = versions()
    print(f"benchmark on {device_name}: torch {v['torch']}, triton {v['triton']}, liger-kernel {v['liger_kernel']}")
    ceiling = copy_ceiling()
    print(f"device-to-device copy ceiling: {ceiling / 1e12:.2f} TB/s")
    timer = cuda_timer(args.warmup, args.samples, args.calls, do_bench=not args.no_do_bench)
    keep_earlier_run("benchmark", report_path(args.outputs, "benchmark"))
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
    print(f"\nwrote {path}\n{draw_figure(path, args.outputs)}\n")
    print(f"{device_name}, torch {v['torch']}, triton {v['triton']}, liger-kernel {v['liger_kernel']}")
    print(table(results, ceiling / 1e12))
    # A peer outside the oracle's tolerance is a finding, reported in its row; a wrong Triton row fails the run.
    wrong = sum(not r.ok for r in results if r.impl == "triton")
    return exit_status("benchmark", wrong, "Triton row(s) off the oracle (the table above)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_interruptible("benchmark", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
