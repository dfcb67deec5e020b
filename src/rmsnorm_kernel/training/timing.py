"""The step timer: ``time/step_ms`` (and the norm layers' GPU time, ``time/rmsnorm_ms``, and the language
model's ``time/tokens_per_s``) per logging window of a run (``StepTimer``)."""

from __future__ import annotations

import functools
import statistics
import time

import lightning as L
import torch

from .network import norm_layers

#: The events that time one norm layer in a step.
EDGES = frozenset({"forward_start", "forward_end", "backward_start", "backward_end"})


class StepTimer(L.Callback):
    """``time/step_ms``: the median time of the training steps in each logging window
    (``trainer.log_every_n_steps`` steps), logged at the window's last step and at the run's last step.

    A step is timed from the start of its batch to its end (forward, backward, optimizer), after the
    parity check and before the checkpoints that end it: the callbacks are listed in that order in
    ``run.py``. Validation is not timed. On the CPU, by the wall clock. On a GPU, without waiting for it
    during the window: CUDA events recorded on the current stream at the start and the end of each step,
    read once at the window's end. A step's time is then the time the stream took from its start marker
    to its end marker, which includes its kernels and any time the GPU waited for the host, so in a
    steady run it is the step's wall time, whichever of the two bounds it.

    ``time/tokens_per_s``, with ``tokens_per_step`` (the language model's): every process's tokens of a
    step over the window's median step time.

    ``time/rmsnorm_ms``, with ``norm_events=True`` on a GPU: the GPU time of every RMSNorm layer of the
    network in each step (``network.norm_layers``: the regression's one, the language model's every block
    norm, q/k norm and final norm), forward and backward, summed over the layers. Each layer's time comes
    from CUDA events recorded on the stream it runs on by its module hooks: before and after its forward,
    and in backward from the moment the gradients of all its outputs exist to the moment the gradients
    of all its inputs are complete (``register_full_backward_pre_hook`` and
    ``register_full_backward_hook``, which see a fused residual add's two outputs and two inputs; the
    networks here give every norm an input and an output that need gradients, without which a layer's
    backward edges would come together, or never, and no step would be timed). The
    median per window, like ``time/step_ms``; ``time/rmsnorm_ms`` over ``time/step_ms`` is the norms'
    share of the step. It is not logged on the CPU (the interpreter's time says nothing about a GPU) nor
    under ``compile=true``, where the layers are fused into a compiled graph and have no edges to time.
    """

    def __init__(self, norm_events: bool = False, tokens_per_step: int | None = None) -> None:
        self.norm_events = norm_events
        self.tokens_per_step = tokens_per_step  # one process's; the language model's windows x their length
        self.medians: list[float] = []  # every logged value, for the run's summary
        self.norm_medians: list[float] = []
        self._start: float | torch.cuda.Event = 0.0
        self._steps: list = []  # the window's steps: (start, end, the layers' events), read at its end
        self._events: dict[str, dict[str, torch.cuda.Event]] = {}  # layer name -> edge -> event
        self._layers: list[str] = []
        self._hooks: list = []

    def on_train_start(self, trainer, pl_module) -> None:
        if self.norm_events and pl_module.device.type == "cuda" and not self._hooks:
            for name, norm in norm_layers(pl_module.net):
                self._layers.append(name)
                self._hooks += [
                    norm.register_forward_pre_hook(functools.partial(self._on_norm, name, "forward_start")),
                    norm.register_forward_hook(functools.partial(self._on_norm, name, "forward_end")),
                    norm.register_full_backward_pre_hook(functools.partial(self._on_norm, name, "backward_start")),
                    norm.register_full_backward_hook(functools.partial(self._on_norm, name, "backward_end")),
                ]

    def on_train_end(self, trainer, pl_module) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._layers = [], []

    def _on_norm(self, layer: str, edge: str, module, *hook_args) -> None:
        if not module.training or (edge.startswith("forward") and not torch.is_grad_enabled()):
            return  # validation and test
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.setdefault(layer, {})[edge] = event

    @staticmethod
    def _now(pl_module) -> float | torch.cuda.Event:
        if pl_module.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._events = {}
        self._start = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps.append((self._start, self._now(pl_module), self._events))
        step = trainer.global_step  # counts the step that just ended
        if step % trainer.log_every_n_steps == 0 or step >= trainer.max_steps:
            self._log_window(trainer, step)

    def _log_window(self, trainer, step: int) -> None:
        steps, self._steps = self._steps, []
        if isinstance(steps[-1][1], torch.cuda.Event):
            steps[-1][1].synchronize()  # the window's one wait: every event before it is complete too
            times = [start.elapsed_time(end) for start, end, _ in steps]
        else:
            times = [(end - start) * 1e3 for start, end, _ in steps]
        norm_times = [
            sum(
                e[layer]["forward_start"].elapsed_time(e[layer]["forward_end"])
                + e[layer]["backward_start"].elapsed_time(e[layer]["backward_end"])
                for layer in self._layers
            )
            for _, _, e in steps
            if self._layers and all(EDGES <= e.get(layer, {}).keys() for layer in self._layers)
        ]
        metrics = {"time/step_ms": statistics.median(times)}
        self.medians.append(metrics["time/step_ms"])
        if self.tokens_per_step:  # every process's tokens, at the window's median step time
            metrics["time/tokens_per_s"] = self.tokens_per_step * trainer.world_size / (metrics["time/step_ms"] / 1e3)
        if norm_times:
            metrics["time/rmsnorm_ms"] = statistics.median(norm_times)
            self.norm_medians.append(metrics["time/rmsnorm_ms"])
        if trainer.logger is not None:
            trainer.logger.log_metrics(metrics, step=step - 1)
