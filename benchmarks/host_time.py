"""Host time per eager call of each RMSNorm path, against its native counterpart, at a host-bound shape.

At 64 x 1024 bfloat16 the GPU work of a call takes a few microseconds; what a caller waits for is the host
issuing it (argument checks, allocation, the launches, autograd). Each path is timed in three forms:
forward under ``torch.no_grad()``, forward with inputs that require grad, and forward + backward
(``torch.autograd.backward`` of the output with a fixed gradient). Each is called ``--calls`` times back
to back between two synchronisations, ``--repeats`` times; the table gives the median host time per call
to issue them (``time.perf_counter`` before the closing synchronisation) and, beside each Triton path,
its ratio to its native counterpart: ``rmsnorm`` to ``F.rms_norm``, the ``RMSNorm`` module to
``torch.nn.RMSNorm``, ``rmsnorm(..., residual=r)`` to the add plus ``F.rms_norm``. An
``autograd.Function`` that does nothing is the floor any custom op pays; Liger's is the other Triton peer
(when installed). The loop is its own rather than ``timing.event_samples``: it reads the wall clock around
a synchronisation, which also runs on the CPU (the tests run it there), where CUDA events do not exist.

    python -m benchmarks.host_time [--json outputs/host_time.json] [--calls N] [--repeats N]

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
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.testing import make_inputs

from .common import INTERPRETED, OneLineParser, at_least, cannot_start, keep_earlier_run, run_interruptible, write_json
from .impls import EPS, make_impl, versions


class _Nothing(torch.autograd.Function):
    """The floor: an autograd.Function that returns its input and passes the gradient back."""

    @staticmethod
    def forward(ctx, x, gamma):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


#: (path, its native counterpart or None): the ratio column compares each Triton path with it
PAIRS = {
    "rmsnorm": "F.rms_norm",
    "RMSNorm module": "torch.nn.RMSNorm",
    "rmsnorm(residual=r)": "r + x, F.rms_norm",
}
FORMS = ("forward, no grad", "forward", "forward + backward")


def paths(n: int, dtype: torch.dtype, device: str, residual: torch.Tensor) -> dict[str, Callable]:
    """Each path as ``f(x, gamma) -> y``."""
    from rmsnorm_kernel import RMSNorm, rmsnorm

    module = RMSNorm(n, eps=EPS, device=device, dtype=dtype)
    native_module = torch.nn.RMSNorm(n, eps=EPS, device=device, dtype=dtype)
    out = {
        "F.rms_norm": lambda x, g: torch.nn.functional.rms_norm(x, (n,), g, EPS),
        "rmsnorm": lambda x, g: rmsnorm(x, g, EPS),
        "torch.nn.RMSNorm": lambda x, g: native_module(x),
        "RMSNorm module": lambda x, g: module(x),
        "r + x, F.rms_norm": lambda x, g: torch.nn.functional.rms_norm(x + residual, (n,), g, EPS),
        "rmsnorm(residual=r)": lambda x, g: rmsnorm(x, g, EPS, residual=residual)[0],
        "autograd.Function doing nothing": _Nothing.apply,
    }
    liger = make_impl("liger", device)
    if liger is not None:
        out["Liger"] = liger
    return out


def host_times(
    device: str = "cuda", m: int = 64, n: int = 1024, calls: int = 300, repeats: int = 5, warmup: int = 20
) -> dict[str, dict[str, float]]:
    """{path: {form: host microseconds per call}}: medians over ``repeats`` of ``calls`` back-to-back
    calls, in bfloat16 on a GPU and float32 on the CPU."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, gamma, dy = make_inputs((m, n), dtype, device)
    residual = make_inputs((m, n), dtype, device, seed=1)[0].requires_grad_()
    x_grad, gamma_grad = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, fn in paths(n, dtype, device, residual).items():

        def no_grad(fn=fn):
            with torch.no_grad():
                fn(x, gamma)

        def backward(fn=fn):
            torch.autograd.backward(fn(x_grad, gamma_grad), dy)

        calls_of = {FORMS[0]: no_grad, FORMS[1]: lambda fn=fn: fn(x_grad, gamma_grad), FORMS[2]: backward}
        out[name] = {form: _per_call(call, sync, calls, repeats, warmup) for form, call in calls_of.items()}
    return out


def _per_call(call: Callable[[], object], sync: Callable, calls: int, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    sync()
    host = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - t0) / calls)
        sync()
    return statistics.median(host) * 1e6


def table_rows(times: dict[str, dict[str, float]]) -> list[tuple[str, ...]]:
    """One row a path: its three host times, each with its ratio to the native counterpart's."""
    rows = []
    for name, t in times.items():
        native = times.get(PAIRS.get(name, ""))
        cells = [f"{t[f]:.1f}" + (f" ({t[f] / native[f]:.2f}x)" if native else "") for f in FORMS]
        rows.append((name, *cells))
    return rows


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
    m, n = 64, 1024
    times = host_times("cuda", m, n, args.calls, args.repeats)
    v = versions()
    print(
        f"host us per eager call at {m}x{n} bfloat16 on {torch.cuda.get_device_name()} "
        f"(x native counterpart's): torch {v['torch']}, triton {v['triton']}"
    )
    print(tables.table(("path", *FORMS), table_rows(times), right=(1, 2, 3)))
    if args.json is not None:
        data = dict(
            device=torch.cuda.get_device_name(),
            **v,
            shape=[m, n],
            dtype="bfloat16",
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
