"""The step timer in this process: window medians by the wall clock on the CPU, and each norm layer's
forward and backward edges on a GPU (stand-in CUDA events)."""

from types import SimpleNamespace

import pytest
import torch

from rmsnorm_kernel.training import timing
from rmsnorm_kernel.training.timing import StepTimer
from tests.helpers import DEVICE


class Logger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))


def test_the_step_timer_logs_each_windows_median_and_the_last_partial_window(monkeypatch):
    clock = iter([0.0, 0.001, 1.0, 1.003, 2.0, 2.002, 3.0, 3.010, 4.0, 4.004])  # steps of 1, 3, 2, 10, 4 ms
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    timer, logger = StepTimer(), Logger()
    module = SimpleNamespace(device=torch.device("cpu"))
    for step in range(5):
        timer.on_train_batch_start(None, module, None, step)
        trainer = SimpleNamespace(global_step=step + 1, max_steps=5, log_every_n_steps=2, logger=logger)
        timer.on_train_batch_end(trainer, module, None, None, step)
    # windows of 2 steps: (1, 3) -> 2, (2, 10) -> 6, then the run's last step alone -> 4; at the steps
    # train/mse uses (0-based: the window's last step)
    assert [(s, round(m["time/step_ms"], 6)) for s, m in logger.logged] == [(1, 2.0), (3, 6.0), (4, 4.0)]
    assert [round(m, 6) for m in timer.medians] == [2.0, 6.0, 4.0]


class TickEvent:
    """A stand-in for ``torch.cuda.Event`` on the CPU: each ``record`` takes the next tick of one clock, and
    every event recorded is kept, so that a test can see the order of the timer's edges."""

    clock = 0

    def __init__(self, enable_timing=False):
        self.tick = None

    def record(self):
        TickEvent.clock += 1
        self.tick = TickEvent.clock

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return float(end.tick - self.tick)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_the_step_timer_times_every_norm_of_the_language_model_apart_forward_and_backward(monkeypatch, impl):
    from rmsnorm_kernel.training.network import build_network, norm_layers

    monkeypatch.setattr(timing.torch.cuda, "Event", TickEvent)
    torch.manual_seed(0)
    # two blocks with q/k norm: 9 norms, fused residual adds with two inputs and two outputs each
    net = build_network(
        None,
        None,
        None,
        impl,
        1e-6,
        kind="transformer",
        dim=16,
        layers=2,
        heads=2,
        mlp_hidden=32,
        seq_len=8,
        qk_norm=True,
    ).to(DEVICE)  # where the kernels run; the events are stand-ins either way
    module = SimpleNamespace(device=SimpleNamespace(type="cuda"), net=net)  # the timer hooks on a GPU only
    timer, logger = StepTimer(norm_events=True), Logger()
    timer.on_train_start(None, module)
    timer.on_train_batch_start(None, module, None, 0)
    net(torch.randint(0, 256, (2, 8), device=DEVICE)).float().square().mean().backward()
    events = timer._events
    trainer = SimpleNamespace(global_step=1, max_steps=1, log_every_n_steps=1, logger=logger)
    timer.on_train_batch_end(trainer, module, None, None, 0)
    timer.on_train_end(None, module)

    names = [name for name, _ in norm_layers(net)]
    assert len(names) == 9 and sorted(events) == sorted(names)
    spans = {}
    for name in names:
        e = {edge: events[name][edge].tick for edge in timing.EDGES}
        assert e["forward_start"] < e["forward_end"] < e["backward_start"] < e["backward_end"], name
        spans[name] = e
    # each layer's backward holds no other layer's: its start waits for every output's gradient (an
    # attention norm's y gets its gradient after the q/k norms' backward)
    backward = sorted((s["backward_start"], s["backward_end"]) for s in spans.values())
    assert all(end < next_start for (_, end), (next_start, _) in zip(backward, backward[1:]))
    # each layer's forward and backward hold no other event: one tick each, 2 x 9 in all
    ((_, metrics),) = logger.logged
    assert metrics["time/rmsnorm_ms"] == 18.0 < metrics["time/step_ms"]
    assert not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for _, m in norm_layers(net)
    )
