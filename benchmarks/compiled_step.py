"""A training step of the project's network under ``torch.compile(mode="reduce-overhead")``, on both paths.

The network is the one training uses, ``build_network(input_dim=64, hidden_dim=257, output_dim=16,
norm_impl, eps=1e-6)`` (Linear -> RMSNorm -> SiLU -> Linear), with MSE loss and Adam on a fixed random
batch of 32, for ``norm_impl`` "reference" and "triton", the same initial weights on both. A step is
``zero_grad``, loss, ``backward``, ``Adam.step``. Compiled, the loss function (the network's forward and
the MSE) goes through ``torch.compile(mode="reduce-overhead")``: its forward and backward graphs are
captured as CUDA graphs and replayed, the Triton path's custom op one node in each. Adam stays eager,
the same on both paths.

Reported per path, eager and compiled:
- time per step: the median of CUDA-event timings of single steps, ``--steps`` of them after
  ``--warmup`` steps (compilation and graph recording happen during the warm-up);
- ``rmsnorm_kernel.call_counts()`` before and after ``--count-steps`` (K) more steps. The kernels count
  their own calls on the device, so graph replays count too: the Triton path must show K forward and
  K backward calls, the reference path none. The script exits 1 when a count differs.

The steps are timed one by one (CUDA events around each, read after the last), not by
``timing.event_samples``, whose samples average several calls: the minimum per step is reported beside
the median.

    python -m benchmarks.compiled_step [--json compiled_step.json] [--steps N] [--warmup N] [--count-steps K]

Needs a CUDA GPU (CUDA graphs): without one it says so in one line and exits 2.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from rmsnorm_kernel import call_counts
from rmsnorm_kernel.checks.report import format_table

from .common import OneLineParser, at_least, file_problem, run_interruptible, write_json
from .impls import versions

INPUT_DIM, HIDDEN_DIM, OUTPUT_DIM, BATCH, EPS, LR = 64, 257, 16, 32, 1e-6, 1e-3
PATHS = ("reference", "triton")
MODES = ("eager", "compiled")


def make_step(norm_impl: str, device: str, compiled: bool, seed: int = 0) -> Callable[[], torch.Tensor]:
    """One training step of a fresh network and optimiser, seeded, on a fixed batch; returns the loss
    (compiled: a CUDA graph's output, valid until the next step)."""
    from rmsnorm_kernel.training.network import build_network

    torch.manual_seed(seed)
    model = build_network(
        input_dim=INPUT_DIM, hidden_dim=HIDDEN_DIM, output_dim=OUTPUT_DIM, norm_impl=norm_impl, eps=EPS
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(BATCH, INPUT_DIM, device=device, generator=g)
    target = torch.randn(BATCH, OUTPUT_DIM, device=device, generator=g)

    def loss_fn(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x), target)

    if compiled:
        torch.compiler.reset()  # each path compiles from a clean cache
        loss_fn = torch.compile(loss_fn, mode="reduce-overhead")

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)  # last step's gradients (graph outputs) are released before the replay
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be overwritten
        loss = loss_fn(x, target)
        loss.backward()
        opt.step()
        return loss

    return step


def time_steps(step: Callable[[], object], steps: int, warmup: int) -> list[float]:
    """Milliseconds of each of ``steps`` steps after ``warmup`` steps, from CUDA events around each."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def count_calls(step: Callable[[], object], k: int) -> dict[str, dict[str, int]]:
    """``call_counts()`` before and after ``k`` steps, and the difference."""
    before = call_counts()
    for _ in range(k):
        step()
    after = call_counts()
    return {"before": before, "after": after, "delta": {key: after[key] - before[key] for key in before}}


def expected_calls(norm_impl: str, k: int) -> dict[str, int]:
    n = k if norm_impl == "triton" else 0
    return {"forward": n, "backward": n}


def measure(norm_impl: str, compiled: bool, device: str, steps: int, warmup: int, count_steps: int) -> dict:
    step = make_step(norm_impl, device, compiled)
    times = time_steps(step, steps, warmup)
    counts = count_calls(step, count_steps)
    loss = float(step().detach())  # read at once: a later replay would overwrite it
    return dict(
        path=norm_impl,
        mode="compiled" if compiled else "eager",
        median_ms=statistics.median(times),
        min_ms=min(times),
        steps=steps,
        warmup=warmup,
        count_steps=count_steps,
        calls=counts,
        calls_ok=counts["delta"] == expected_calls(norm_impl, count_steps),
        last_loss=loss,
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.compiled_step", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    parser.add_argument("--steps", type=at_least(1), default=200, help="timed steps (default 200)")
    parser.add_argument("--warmup", type=at_least(0), default=20, help="steps before timing (default 20)")
    parser.add_argument(
        "--count-steps", type=at_least(1), default=10, help="K: steps between the two call_counts() reads (default 10)"
    )
    args = parser.parse_args(argv)
    return run_interruptible("compiled_step", lambda: run(args))


def run(args) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    problem = file_problem("--json", args.json)
    if problem is not None:
        print(f"compiled_step: {problem}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compiled_step: needs a CUDA GPU (CUDA graphs); none found.", file=sys.stderr)
        return 2

    results = [
        measure(path, mode == "compiled", "cuda", args.steps, args.warmup, args.count_steps)
        for path in PATHS
        for mode in MODES
    ]
    v = versions()
    device_name = torch.cuda.get_device_name()
    print(
        f"training step, batch {BATCH}, {INPUT_DIM}->{HIDDEN_DIM}->{OUTPUT_DIM}, Adam, on {device_name}: "
        f"torch {v['torch']}, triton {v['triton']}"
    )
    rows = [
        (
            r["path"],
            r["mode"],
            f"{r['median_ms']:.3f}",
            f"{r['min_ms']:.3f}",
            f"{r['calls']['delta']['forward']}/{r['calls']['delta']['backward']}",
            "{forward}/{backward}".format(**expected_calls(r["path"], args.count_steps)),
            "ok" if r["calls_ok"] else "WRONG",
            f"{r['last_loss']:.6g}",
        )
        for r in results
    ]
    print(
        format_table(
            (
                "path",
                "mode",
                "median ms/step",
                "min ms/step",
                f"calls fwd/bwd in {args.count_steps} steps",
                "expected",
                "count",
                "loss",
            ),
            rows,
            right=(2, 3, 4, 5, 7),
        )
    )
    if args.json is not None:
        data = dict(
            device=device_name,
            **v,
            batch=BATCH,
            dims=[INPUT_DIM, HIDDEN_DIM, OUTPUT_DIM],
            eps=EPS,
            optimizer=f"Adam(lr={LR})",
            compile='torch.compile(loss_fn, mode="reduce-overhead")',
            timing="CUDA events around each step, median",
            results=results,
        )
        print(f"wrote {write_json(args.json, data)}")
    return 0 if all(r["calls_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
