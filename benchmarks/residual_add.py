"""The fused residual add and norm against what a user would run instead, at activation-sized shapes.

``(y, h) = rmsnorm(x, gamma, residual=r)`` with h = x + r, in bfloat16: the forward, and the forward +
backward (the gradients of y and h both flowing back to x, r and gamma).

Implementations (each checked against the float64 oracle of its numerics, and timed whatever the check
says; a result off the oracle is marked in the table):

- ``triton``: this package's fused kernels;
- ``compile``: ``torch.compile`` of ``h = x + r; y = F.rms_norm(h, ...)``, which Inductor fuses, compiled
  for each shape;
- ``eager``: the same two ops without compiling, the unfused floor;
- ``liger``: Liger-Kernel's ``LigerFusedAddRMSNormFunction`` (its default ``casting_mode="llama"``, so it is
  checked against the llama-mode oracle), where ``liger_kernel`` imports.

Two times per call, as the sweep takes them (``sweep.measure.CudaTimers``): the GPU time, from replays of
the call captured in a CUDA graph (the L2 cache flushed before each; the profiler's kernel times where a
call cannot be captured), and the whole call, host work included, by CUDA events around back-to-back
calls. At x of 128 MiB a forward + backward is a few hundred microseconds of GPU work, about what the
host takes to issue it through autograd, so the two differ.

    python -m benchmarks.residual_add [--json outputs/residual_add.json] [--repeats K] [--table JSON]

Needs a CUDA GPU to measure: without one it exits 2. Exits 1 when this package's results miss the oracle
(a peer's miss is reported, not failed). ``--table`` prints a results file as a Markdown table
and needs none.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from rmsnorm_kernel import rmsnorm, tables
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import add_oracle
from rmsnorm_kernel.ops.tolerances import compare, tolerance_dtype
from rmsnorm_kernel.testing import make_inputs

from .common import (
    INTERPRETED,
    OneLineParser,
    at_least,
    cannot_start,
    exit_status,
    keep_earlier_run,
    run_interruptible,
    write_json,
)
from .impls import EPS, versions

#: (rows, N) in bfloat16: x of 128 MiB at every N of the sweep's activation regime, and of 256 MiB at 4096.
SHAPES = [(65536, 1024), (32768, 2048), (16384, 4096), (8192, 8192), (4096, 16384), (32768, 4096)]
DTYPE = torch.bfloat16
DIRECTIONS = ("fwd", "fwd+bwd")
#: The results file when --json is not given (``checks.clean`` knows it by this name).
DEFAULT_JSON = "outputs/residual_add.json"

AddNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _add_then_norm(x: torch.Tensor, r: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), g, EPS), h


def implementations() -> dict[str, tuple[AddNorm, str]]:
    """{name: (fn(x, r, gamma) -> (y, h), the numerics mode its oracle uses)}. Called once per shape:
    ``compile`` is compiled afresh each time, for that shape alone (``dynamic=False`` after
    ``torch.compiler.reset()``), as a model of fixed shapes is; otherwise the second shape would recompile
    it with dynamic sizes, whose kernels are slower."""
    torch.compiler.reset()
    impls: dict[str, tuple[AddNorm, str]] = {
        "triton": (lambda x, r, g: rmsnorm(x, g, EPS, residual=r), "torch"),
        "compile": (torch.compile(_add_then_norm, dynamic=False), "torch"),
        "eager": (_add_then_norm, "torch"),
    }
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        return impls
    impls["liger"] = (lambda x, r, g: LigerFusedAddRMSNormFunction.apply(x, r, g, EPS, 0.0, "llama", False), "llama")
    return impls


def make_calls(fn: AddNorm, x, r, g, dy, dh) -> dict[str, Callable[[], object]]:
    """The forward, and the forward + backward to x, r and gamma, of ``fn`` on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, r, g)]

    def fwd_bwd():
        y, h = fn(*leaves)
        return torch.autograd.grad((y, h), leaves, (dy, dh))

    def fwd():
        with torch.no_grad():
            return fn(x, r, g)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def check(fn: AddNorm, mode: str, x, r, g, dy, dh) -> dict[str, str | None]:
    """Per direction, None when fn's results in it (the forward: y and h; with the backward: also dx,
    dresidual and dgamma) match the oracle of ``mode`` within the declared tolerances, otherwise the first
    that does not."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, r, g)]
    y, h = fn(*leaves)
    grads = torch.autograd.grad((y, h), leaves, (dy, dh))
    want = add_oracle(x, r, g, dy, dh, EPS, mode=mode)
    problems = []
    for name, got, w in zip(("y", "h", "dx", "dresidual", "dgamma"), (y, h, *grads), want):
        c = compare(got.detach(), w, tolerance_dtype(w.dtype, x.dtype, mode))
        problems.append(None if c.ok else f"{name} off the oracle by {c.worst_over_tol:.3g} x the tolerance")
    return {"fwd": _first(problems[:2]), "fwd+bwd": _first(problems)}


def _first(problems: list[str | None]) -> str | None:
    return next((p for p in problems if p is not None), None)


def measure(shape, device: str, timer: Callable[[Callable[[], object]], dict], repeats: int = 1) -> list[dict]:
    """One row per implementation and direction at ``shape``: the times ``timer`` gives (``gpu_ms``, and
    whatever else it measures), and the check (the times are taken either way: a peer that misses a
    tolerance is still what a user would run). With ``repeats`` > 1 every implementation is timed that
    many times, in rounds that visit each once, so that drift hits them alike; a row holds the median of
    each time and, as ``gpu_ms_samples``, every GPU time."""
    x, g, dy = make_inputs(shape, DTYPE, device)
    r, _, dh = make_inputs(shape, DTYPE, device, seed=1)
    prepared = []
    for name, (fn, mode) in implementations().items():
        prepared.append((name, check(fn, mode, x, r, g, dy, dh), make_calls(fn, x, r, g, dy, dh)))
    samples: dict[tuple[str, str], list[dict]] = {(name, d): [] for name, _, _ in prepared for d in DIRECTIONS}
    for _ in range(repeats):
        for name, _, calls in prepared:
            for direction in DIRECTIONS:
                samples[(name, direction)].append(timer(calls[direction]))
    rows = []
    for name, problems, _ in prepared:
        for direction in DIRECTIONS:
            row = dict(shape=list(shape), impl=name, direction=direction, problem=problems[direction])
            rows.append(row | _medians(samples[(name, direction)]))
    return rows


def _medians(samples: list[dict]) -> dict:
    """The first sample's keys, numbers replaced by their median over the samples; with more than one
    sample, ``gpu_ms_samples`` too."""
    out = {}
    for key, value in samples[0].items():
        numbers = [s[key] for s in samples]
        out[key] = statistics.median(numbers) if isinstance(value, (int, float)) and None not in numbers else value
    if len(samples) > 1:
        out["gpu_ms_samples"] = [s["gpu_ms"] for s in samples]
    return out


def table(data: dict) -> str:
    """The results as a Markdown table: per implementation, GPU ms / whole-call ms (where the file has
    them), each shape and direction a row; the fastest GPU time among the results on their oracle in bold,
    and † where a result was off its oracle (``problem``). ValueError for a file with no rows."""
    if not data["rows"]:
        raise ValueError("it holds no rows")
    impls = list(dict.fromkeys(row["impl"] for row in data["rows"]))
    rows = []
    keys = list(dict.fromkeys((tuple(row["shape"]), row["direction"]) for row in data["rows"]))
    for shape, direction in keys:
        cells = {r["impl"]: r for r in data["rows"] if tuple(r["shape"]) == shape and r["direction"] == direction}
        times = [c["gpu_ms"] for c in cells.values() if c["gpu_ms"] is not None and not c["problem"]]
        best = min(times) if times else None
        out = []
        for impl in impls:
            cell = cells.get(impl)
            if cell is None or cell["gpu_ms"] is None:
                out.append("failed its check, not timed" if cell and cell["problem"] else "–")
                continue
            text = f"{cell['gpu_ms']:.3f}"
            text = f"**{text}**" if cell["gpu_ms"] == best and not cell["problem"] else text
            if cell.get("whole_ms") is not None:
                text += f" / {cell['whole_ms']:.2f}"
            out.append(text + (" †" if cell["problem"] else ""))
        rows.append((f"{shape[0]} x {shape[1]}", direction, *out))
    return tables.table((f"rows x N ({data['dtype']})", "direction", *impls), rows, markdown=True)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.residual_add", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--json", type=Path, default=Path(DEFAULT_JSON), help=f"results file (default {DEFAULT_JSON})")
    parser.add_argument("--table", type=Path, default=None, help="print a results file as a Markdown table; no GPU")
    parser.add_argument(
        "--repeats",
        type=at_least(1),
        default=1,
        help="time every implementation this many times, in rounds, and report the medians (default 1)",
    )
    args = parser.parse_args(argv)
    return run_interruptible("residual_add", lambda: run(args))


def run(args) -> int:
    if args.table is not None:
        try:
            data = json.loads(args.table.read_text())
            print(table(data))
        except OSError as e:
            print(f"residual_add: --table {args.table} cannot be read ({e.strerror or e})", file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError) as e:
            print(f"residual_add: --table {args.table}: not a results file of this command ({e})", file=sys.stderr)
            return 2
        return 0
    if (refused := cannot_start("residual_add", args.json, backend() == CUDA, INTERPRETED)) is not None:
        return refused
    from .sweep.measure import CudaTimers

    timers = CudaTimers()

    def timer(fn) -> dict:
        gpu_s, method, note = timers.gpu(fn, lambda: None, lambda outputs: None)
        whole_s, host_s = timers.whole(fn)
        return dict(gpu_ms=gpu_s * 1e3, gpu_method=method, whole_ms=whole_s * 1e3, host_ms=host_s * 1e3)

    rows = []
    for shape in SHAPES:
        rows += measure(shape, "cuda", timer, args.repeats)
        print(f"{shape[0]} x {shape[1]} done", flush=True)
    data = dict(device=torch.cuda.get_device_name(), **versions(), dtype=str(DTYPE).removeprefix("torch."))
    timing = "gpu_ms: CUDA-graph replays (sweep.measure.CudaTimers); whole_ms: CUDA events"
    if args.repeats > 1:
        timing += f"; medians of {args.repeats} rounds"
    data.update(timing=timing, rows=rows)
    print(table(data))
    keep_earlier_run("residual_add", args.json)
    print(f"wrote {write_json(args.json, data)}")
    wrong = sum(row["problem"] is not None for row in rows if row["impl"] == "triton")
    return exit_status("residual_add", wrong, "Triton row(s) with a problem (the table above)")


if __name__ == "__main__":
    sys.exit(main())
