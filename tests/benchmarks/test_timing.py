"""The timers of whole calls: nothing timed without a GPU; on one, times that are positive and finite."""

import math

import pytest
import torch

from benchmarks.timing import copy_ceiling, cuda_timer, event_samples, no_timer


def test_without_a_gpu_nothing_is_timed_and_the_call_is_not_made():
    made = []
    timing = no_timer(lambda: made.append(1))
    assert (timing.events_s, timing.gpu_s, timing.host_s) == (None, None, None) and made == []


@pytest.mark.gpu
def test_the_cuda_timer_makes_the_calls_and_times_them():
    x = torch.ones(1 << 20, device="cuda")
    calls = []

    def call():
        calls.append(1)
        return x * 2

    timing = cuda_timer(warmup=2, samples=3, calls=4, do_bench=False)(call)
    assert len(calls) == 2 + 3 * 4 and timing.gpu_s is None
    assert 0 < timing.events_s < 1 and 0 < timing.host_s < 1
    per_call, host = event_samples(call, 2, 2)
    assert math.isfinite(per_call) and per_call > 0 and host > 0
    assert copy_ceiling(nbytes=1 << 24, samples=2, calls=2) > 0
