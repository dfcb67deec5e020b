"""Timing whole calls on a CUDA GPU: the timers a measurement hands to ``rows.measure_row``, and the copy
ceiling every bandwidth is compared with.

CUDA events around back-to-back whole calls (allocations and autograd included), the median of the
samples, with the host time to issue a call taken over the same samples (``event_samples``);
``triton.testing.do_bench``'s median beside it (``cuda_timer``). Without a GPU nothing is timed
(``no_timer``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


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
