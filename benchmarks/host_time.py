"""Host time per call of the Triton path's public pieces at a small shape, against ``F.rms_norm``.

At 128x257 float32 the GPU work of a call takes a few microseconds; what a caller waits for is the host
issuing it (argument checks, allocation, the launch, autograd). Each piece is called ``--calls`` times
back to back between two synchronisations, ``--repeats`` times; the table gives the median per call of
the host time to issue the calls (``time.perf_counter`` before the closing synchronisation) and of the
wall time until the GPU is done (after it). The calls are the benchmark's own (``impls.make_call``);
``autograd.grad of x * gamma`` is the floor that PyTorch's autograd engine puts under any forward +
backward, one C++ op. The loop is its own rather than ``timing.event_samples``: it reads the wall clock
around a synchronisation, which also runs on the CPU (the tests run it there), where CUDA events do not
exist.

    python -m benchmarks.host_time [--json host_time.json] [--calls N] [--repeats N]

Needs a CUDA GPU: without one it exits 2.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rmsnorm_kernel import tables
from rmsnorm_kernel.ops import kernels
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.testing import make_inputs

from .common import INTERPRETED, OneLineParser, at_least, cannot_start, keep_earlier_run, run_interruptible, write_json
from .impls import EPS, FWD, FWD_BWD, make_call, make_impl, versions


def pieces(x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The calls timed, by name."""
    triton_fn = make_impl("triton", x.device.type)
    torch_fn = make_impl("F.rms_norm", x.device.type)
    return {
        "rmsnorm fwd": make_call(FWD, triton_fn, x, gamma, dy),
        "rmsnorm fwd+bwd": make_call(FWD_BWD, triton_fn, x, gamma, dy),
        "kernels.rmsnorm_forward": lambda: kernels.rmsnorm_forward(x, gamma, EPS),
        "kernels.rmsnorm_backward": lambda: kernels.rmsnorm_backward(dy, x, gamma, EPS),
        "F.rms_norm fwd": make_call(FWD, torch_fn, x, gamma, dy),
        "F.rms_norm fwd+bwd": make_call(FWD_BWD, torch_fn, x, gamma, dy),
        "autograd.grad of x * gamma": make_call(FWD_BWD, lambda a, g: a * g, x, gamma, dy),
    }


def host_times(
    device: str = "cuda", m: int = 128, n: int = 257, calls: int = 300, repeats: int = 5, warmup: int = 20
) -> dict[str, dict[str, float]]:
    """{piece: {"host_us": ..., "wall_us": ...}}: medians over ``repeats`` of the per-call times of
    ``calls`` back-to-back calls."""
    x, gamma, dy = make_inputs((m, n), torch.float32, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, fn in pieces(x, gamma, dy).items():
        for _ in range(warmup):
            fn()
        sync()
        host, wall = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            host.append((t1 - t0) / calls)
            wall.append((t2 - t0) / calls)
        out[name] = {"host_us": statistics.median(host) * 1e6, "wall_us": statistics.median(wall) * 1e6}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.host_time", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the times to this JSON file")
    parser.add_argument(
        "--calls", type=at_least(1), default=300, help="calls between two synchronisations (default 300)"
    )
    parser.add_argument(
        "--repeats", type=at_least(1), default=5, help="timed repeats; the median is reported (default 5)"
    )
    args = parser.parse_args(argv)
    return run_interruptible("host_time", lambda: run(args))


def run(args) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    if (refused := cannot_start("host_time", args.json, backend() == CUDA, INTERPRETED)) is not None:
        return refused
    m, n = 128, 257
    times = host_times("cuda", m, n, args.calls, args.repeats)
    v = versions()
    print(
        f"host time per call at {m}x{n} float32 on {torch.cuda.get_device_name()}: "
        f"torch {v['torch']}, triton {v['triton']}"
    )
    print(
        tables.table(
            ("piece", "host us", "wall us"),
            [(name, f"{t['host_us']:.1f}", f"{t['wall_us']:.1f}") for name, t in times.items()],
            right=(1, 2),
        )
    )
    if args.json is not None:
        data = dict(
            device=torch.cuda.get_device_name(),
            **v,
            shape=[m, n],
            dtype="float32",
            calls=args.calls,
            repeats=args.repeats,
            statistic="median",
            times=times,
        )
        keep_earlier_run("host_time", args.json)
        print(f"wrote {write_json(args.json, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
