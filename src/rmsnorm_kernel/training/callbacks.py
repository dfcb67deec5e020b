"""The callbacks of a training run: parity of the RMSNorm paths with the reference along the run, validation
at the last step, the step timer, the periodic checkpoints, and ``last.ckpt`` written when a signal stops
the run."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint, TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn

from ..ops.contract import ContractError
from ..ops.impls import IMPLS
from ..ops.module import RMSNorm
from ..ops.tolerances import TOLERANCES, compare
from .model import TrainingStopped
from .network import loss, network_copy, network_input, norm_layers


class ParityError(TrainingStopped):
    """A path disagreed with the reference beyond the declared tolerance during training."""


#: The oracle every other path is compared with.
ORACLE = "reference"
#: The paths compared with the oracle at each check, in the order they are reported.
COMPARED = tuple(impl for impl in IMPLS if impl != ORACLE)
#: What a norm layer's parity check calls its outputs; the rest of what it compares are gradients.
OUTPUTS = ("y", "h")
#: The path whose parity numbers keep the plain names (``parity/output_err``).
KERNEL = "triton"


def parity_name(path: str, name: str) -> str:
    """The name of one path's parity number in ``Parity.state_dict``, in a run's metrics and, after
    ``parity/``, in TensorBoard: the kernel's plain (``output_err``), any other path's prefixed with the
    path (``native_output_err``)."""
    return name if path == KERNEL else f"{path}_{name}"


def parity_tag(path: str, name: str) -> str:
    """The TensorBoard tag, and the run's metric, of one path's parity number: ``parity/<parity_name>``."""
    return f"parity/{parity_name(path, name)}"


@dataclass
class PathVerdict:
    """One path's comparison with the oracle over the run's whole history."""

    output_err: float | None = None  # the initial check's (step 0) largest differences
    grad_err: float | None = None
    ok: bool = True  # the initial check's verdict
    failed_steps: list[int] = field(default_factory=list)  # the checked steps past the tolerance
    worst_over_tol: float = 0.0  # the largest over every check (all processes')
    unknown_before: int | None = None  # resumed at this step from a checkpoint without this path's verdicts
    # The worst norm layer: its largest ratio to the tolerance over every check, and the layer it was seen
    # at (``network.norm_layers``' name: ``norm``, ``blocks.1.mlp_norm``...).
    norm_worst_over_tol: float = 0.0
    norm_worst_layer: str = ""


class Parity(L.Callback):
    """Every RMSNorm path on the step's batch, from a copy of the module's current weights, each compared
    with the reference (the oracle) layer by layer: Triton against the reference, ``F.rms_norm`` (native)
    against the reference, whichever path the run trains on.

    A copy of the network on the reference path runs the batch forward and backward (the gradient of the
    network's loss, ``network.loss``), and each norm layer (``network.norm_layers``) keeps the inputs it
    saw and the gradients its outputs got. Each layer is then run alone on every path from those inputs
    and output gradients, and its outputs (y, and h with a residual) and gradients (of x, of the residual
    and of the weight) are compared with the reference path's within the tolerance of ``ops/tolerances.py``
    for their dtype. Layer by layer, because the tolerance is the operator's: a whole network's logits
    carry every later layer's rounding too, past an operator's tolerance in bfloat16 at a dozen blocks on
    any path. A check passes when every layer of each compared path agrees (``COMPARED``), and fails when
    one does not, naming the path and its worst layer. The module itself, its path, weights and gradients
    are left as they were. The comparison runs in the dtype of the parameters: float32, also when
    training runs in mixed precision, or bfloat16 under ``trainer.precision=bf16-true``. The Triton calls
    it makes (one forward and one backward per layer) are counted in the module's
    ``calls["parity/forward"]`` and ``calls["parity/backward"]``, apart from the training steps' counts.

    - Step 0 is the initial check: its verdict is one of the run's end checks (``ok`` of each path), not
      a stop. With ``every_n_steps=0`` a run whose kernel is wrong from the start trains to its end and
      reports every check; otherwise the next check stops it. A resumed run starts past step 0 and does
      not repeat it. When the Triton contract refuses the batch, nothing is compared, on any path, then
      or later, and ``skipped`` holds the contract's reason.
    - Every ``every_n_steps`` steps after that (0: never), the same comparison along the run: a kernel that
      drifts after many Adam steps, or a bad launch plan for a shape the first batch did not have. A
      difference past the tolerance stops the run with ``ParityError``, naming the step and the path,
      before that step changes any weight.
    - Under data parallelism each process compares its own rows, and every verdict (step 0's too) is the
      worst over all processes, so every process stops together and the end check covers every row. The
      numbers reported (``output_err``, ``grad_err``, ``worst_over_tol`` of each path) are the largest over
      all processes too: the summary and TensorBoard give those of the global batch.
    - Every verdict rides in the run's checkpoints (``state_dict``, which Lightning saves in each one:
      the periodic ones, ``last.ckpt``, ``final.ckpt`` and the one a signal writes) and comes back when a
      run resumes from one (``load_state_dict``), so a resumed run reports the whole history: step 0's
      errors and pass or fail, every check along the run and its worst ratio to the tolerance, a skip.
    - A run resumed from a checkpoint that carries no verdicts of a path (none at all, or none of one
      compared path: no ``native_*`` keys, say) cannot know what the steps
      before it showed for that path: its ``unknown_before`` holds the step it resumed at, and the run
      fails its end check with a line that says so (``run.failed_checks``). A verdict that was never seen
      is never reported as passed.

    Logged at each checked step, for each path under its ``parity_name`` (the kernel's ``parity/output_err``,
    native's ``parity/native_output_err``): ``output_err`` and ``grad_err`` (the largest absolute
    differences from the reference), ``worst_over_tol`` (the largest ``|a - b| / (atol + rtol * |b|)`` over
    every element compared: the tolerance rule passes at 1 or less), at step 0 also ``initial_output_err``
    and ``initial_grad_err``; ``norm_worst_over_tol``, the worst layer's ratio (which layer:
    ``PathVerdict.norm_worst_layer``, in the summary and in a stop's message); and the parity call counts.
    """

    def __init__(self, every_n_steps: int) -> None:
        self.every_n_steps = every_n_steps
        self.paths = {path: PathVerdict() for path in COMPARED}
        self.dtype: torch.dtype | None = None  # of the compared outputs: it picks the tolerance
        self.skipped: str | None = None
        self.checked_steps: list[int] = []  # the steps whose comparison ran, over the run's whole history
        self._loaded: set[str] = set()  # the paths whose verdicts a checkpoint gave back
        self._started: set[int] = set()

    def state_dict(self) -> dict:
        """Every verdict so far, in plain types (a checkpoint is read back with ``weights_only=True``)."""
        state = {
            "dtype": None if self.dtype is None else str(self.dtype).removeprefix("torch."),
            "skipped": self.skipped,
            "checked_steps": list(self.checked_steps),
        }
        for path, verdict in self.paths.items():
            state.update({parity_name(path, name): value for name, value in asdict(verdict).items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        dtype = state["dtype"]
        self.dtype = None if dtype is None else getattr(torch, dtype)
        self.skipped = state["skipped"]
        self.checked_steps = list(state["checked_steps"])
        for path, verdict in self.paths.items():
            if parity_name(path, "ok") not in state:
                continue  # a checkpoint written before this path was compared: on_train_start says so
            verdict.output_err = state[parity_name(path, "output_err")]
            verdict.grad_err = state[parity_name(path, "grad_err")]
            verdict.ok = bool(state[parity_name(path, "ok")])
            verdict.failed_steps = list(state[parity_name(path, "failed_steps")])
            verdict.worst_over_tol = float(state[parity_name(path, "worst_over_tol")])
            verdict.unknown_before = state[parity_name(path, "unknown_before")]
            # absent from checkpoints written before the norm layers were compared one by one
            verdict.norm_worst_over_tol = float(state.get(parity_name(path, "norm_worst_over_tol"), 0.0))
            verdict.norm_worst_layer = state.get(parity_name(path, "norm_worst_layer"), "")
            self._loaded.add(path)

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning has restored the checkpoint by now: a run past step 0 that got no verdicts of a path
        # from it resumed from a checkpoint written without them.
        if trainer.global_step > 0:
            for path, verdict in self.paths.items():
                if path not in self._loaded:
                    verdict.unknown_before = trainer.global_step

    def _due(self, step: int) -> bool:
        if self.skipped is not None or step in self._started:
            return False  # a restarted epoch loop can start the same step twice
        if step == 0:
            return True
        return self.every_n_steps > 0 and step % self.every_n_steps == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if not self._due(step):
            return
        self._started.add(step)
        x, y = batch
        pl_module.settle_calls("train")  # the training steps' calls so far, before these
        try:
            results = self._every_layer(pl_module, x, y)
        except ContractError as e:
            self.skipped = f"the Triton contract refuses this shape ({e})"
            return
        finally:
            pl_module.settle_calls("parity")
        layers = list(results)
        # per compared path: the worst ratio to the tolerance, the output and the gradient differences (each
        # the largest over the layers), then each layer's worst ratio
        local = []
        for path in COMPARED:
            per_layer = []
            output_err = grad_err = 0.0
            for layer in layers:
                ours, oracle = results[layer][path], results[layer][ORACLE]
                comparisons = {key: compare(ours[key], oracle[key]) for key in oracle}
                output_err = max([output_err] + [c.max_abs for k, c in comparisons.items() if k in OUTPUTS])
                grad_err = max([grad_err] + [c.max_abs for k, c in comparisons.items() if k not in OUTPUTS])
                per_layer.append(max(c.worst_over_tol for c in comparisons.values()))  # <= 1: all passed
            local += [max(per_layer), output_err, grad_err, *per_layer]
        # The largest over every process: the same verdict on each (none is left waiting in the next
        # collective), and the numbers of the global batch. In float64: a float32 copy would round a ratio
        # just above 1 down to 1.
        reduced = trainer.strategy.reduce(torch.tensor(local, dtype=torch.float64, device=x.device), reduce_op="max")
        rows = reduced.view(len(COMPARED), 3 + len(layers)).tolist()
        measured = {path: row[:3] for path, row in zip(COMPARED, rows)}
        by_layer = {path: dict(zip(layers, row[3:])) for path, row in zip(COMPARED, rows)}
        self.checked_steps.append(step)
        dtype = results[layers[0]][ORACLE]["y"].dtype
        if step == 0:
            self.dtype = dtype
        metrics = {}
        for path, (worst, output_err, grad_err) in measured.items():
            verdict = self.paths[path]
            if worst > 1.0:
                verdict.failed_steps.append(step)
            verdict.worst_over_tol = max(verdict.worst_over_tol, worst)
            numbers = {"output_err": output_err, "grad_err": grad_err, "worst_over_tol": worst}
            if by_layer[path]:
                layer, ratio = max(by_layer[path].items(), key=lambda item: item[1])
                numbers["norm_worst_over_tol"] = ratio
                if ratio >= verdict.norm_worst_over_tol:
                    verdict.norm_worst_over_tol, verdict.norm_worst_layer = ratio, layer
            if step == 0:  # the initial check: its numbers and verdict are the end check's
                verdict.output_err, verdict.grad_err, verdict.ok = output_err, grad_err, worst <= 1.0
                numbers.update({"initial_output_err": output_err, "initial_grad_err": grad_err})
            metrics.update({parity_tag(path, name): v for name, v in numbers.items()})
        if trainer.logger is not None:
            metrics["calls/parity_forward"] = float(pl_module.calls["parity/forward"])
            metrics["calls/parity_backward"] = float(pl_module.calls["parity/backward"])
            trainer.logger.log_metrics(metrics, step=step)
        past = [(path, numbers) for path, numbers in measured.items() if numbers[0] > 1.0]
        if step > 0 and past:
            tol = TOLERANCES[dtype]
            differences = "; ".join(
                f"the {path} and {ORACLE} paths differ by {output_err:.3g} in outputs and {grad_err:.3g} in "
                f"gradients, {worst:.3g} times the {str(dtype).removeprefix('torch.')} tolerance "
                f"(atol {tol.atol:g}, rtol {tol.rtol:g})" + self._worst_layer(by_layer[path])
                for path, (worst, output_err, grad_err) in past
            )
            raise ParityError(f"parity at step {step}: {differences}, before that step changed any weight")

    @staticmethod
    def _worst_layer(ratios: dict[str, float]) -> str:
        """``, worst at the norm layer <layer> (<ratio> times the tolerance)``."""
        if not ratios:
            return ""
        layer, ratio = max(ratios.items(), key=lambda item: item[1])
        return f", worst at the norm layer {layer} ({ratio:.3g} times the tolerance)"

    @staticmethod
    def _every_layer(pl_module, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
        """Each norm layer's results on every path, ``{layer: {path: {"y", "h", "dx", "dresidual",
        "dweight": tensor}}}`` (``h`` and ``dresidual`` with a residual, ``dweight`` with a weight): the
        layer's forward on the inputs it saw, and its backward from the gradients its outputs got, in a
        forward and backward of the network on the reference path from the module's weights."""
        kind = pl_module.hparams.kind
        net = network_copy(pl_module.net, **{**pl_module.network_kwargs(), "norm_impl": ORACLE, "norm_fallback": None})
        net = net.to(x.device)
        seen: dict[str, list] = {}  # layer -> [its inputs, its outputs' gradients]

        def save_inputs(name, module, args):
            seen[name] = [tuple(a.detach() for a in args), None]

        def save_output_grads(name, module, grad_outputs):
            seen[name][1] = grad_outputs

        layers = norm_layers(net)
        hooks = [m.register_forward_pre_hook(functools.partial(save_inputs, n)) for n, m in layers]
        hooks += [m.register_full_backward_pre_hook(functools.partial(save_output_grads, n)) for n, m in layers]
        try:
            params = [p for p in net.parameters() if p.requires_grad]
            torch.autograd.grad(loss(kind, net(network_input(net, x)), y), params)
        finally:
            for hook in hooks:
                hook.remove()
        results = {}
        for name, layer in layers:
            if name not in seen:
                continue  # a layer the forward did not call
            inputs, grad_outputs = seen[name]
            grad_outputs = grad_outputs or (None,) * 2  # outputs without gradients: compared against zeros
            results[name] = {}
            for impl in IMPLS:
                copy = RMSNorm(
                    layer.normalized_shape,
                    layer.eps,
                    layer.elementwise_affine,
                    device=x.device,
                    dtype=None if layer.weight is None else layer.weight.dtype,
                    impl=impl,
                    activation=layer.activation,
                    mode=layer.mode,
                )
                copy.load_state_dict(layer.state_dict())
                leaves = [t.clone().requires_grad_() for t in inputs]
                outs = copy(*leaves)
                outs = outs if isinstance(outs, tuple) else (outs,)
                wrt = leaves + ([copy.weight] if copy.weight is not None else [])
                grads = torch.autograd.grad(
                    outs, wrt, [torch.zeros_like(o) if g is None else g for o, g in zip(outs, grad_outputs)]
                )
                names = ["y", "h"][: len(outs)] + ["dx", "dresidual"][: len(leaves)]
                names += ["dweight"] if copy.weight is not None else []
                results[name][impl] = dict(zip(names, [o.detach() for o in outs] + list(grads)))
        return results


class ValidateAtLastStep(L.Callback):
    """Validation at a run's last step as well as every ``trainer.val_check_interval`` steps, so that the
    validation loss (``val/mse``, ``val/loss``) exists at the final step whatever the schedule (a resumed
    run too).

    Setting ``Trainer.should_stop`` after the last training step is the public way to ask Lightning for
    a validation pass there (it validates when a run is asked to stop, as with early stopping); the run
    ends at that step anyway. A step that is already a validation step is validated once.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


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


class StepProgressBar(TQDMProgressBar):
    """Lightning's progress bar, counting the run's training steps: ``Epoch 1: 6/8`` at step 6 of
    ``trainer.max_steps`` 8, also after a resume, in the epoch of the training data (a step's epoch is the
    step over the batches of an epoch, ``data.ResumableBatches``).

    A run is scheduled in steps (``trainer.max_steps``; Lightning's ``max_epochs`` is then -1), and
    Lightning's own bars count the batches of an epoch, its epochs out of ``max_epochs - 1``: ``Epoch
    0/-2``, and after a resume mid-epoch a count past its total (``8/2``)."""

    @property
    def total_train_batches(self) -> int:
        return self.trainer.max_steps

    def on_train_epoch_start(self, trainer, *args) -> None:
        # one bar for the whole run, not reset to 0 at each epoch: its total, and the steps done before
        # this epoch (or this process)
        bar = self.train_progress_bar
        bar.total = self.total_train_batches
        bar.initial = bar.n = trainer.global_step
        # the epoch of the training data (data.ResumableBatches), which a resume continues mid-way
        bar.set_description(f"Epoch {trainer.global_step // trainer.num_training_batches}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)


class StepCheckpoints(Checkpoint):
    """``step<NNNNN>.ckpt`` and ``last.ckpt`` every ``every_n_steps`` training steps, each written once the
    step's work is all done: after its validation when the step is a validation step, else at its end.

    Why not Lightning's ``ModelCheckpoint(every_n_train_steps=...)``: it writes in ``on_train_batch_end``,
    before the validation of that step, and a run resumed from that file does not run that validation
    again (Lightning's loop, restarted after ``on_train_batch_end``, counts it as done). A crash between the
    write and the end of the validation would lose that step's validation loss for good. Written after the
    validation (``on_validation_end``, the point where ``ModelCheckpoint(monitor=...)`` writes too), the
    file holds the validated step, and Lightning's loop, restarted there, neither repeats the validation
    nor skips it; a crash during the validation resumes from the previous checkpoint and redoes it. The
    only alternative with public APIs, running the missing validation on resume, has no public route
    inside ``Trainer.fit``.

    Whether Lightning validates after the step that just ended is known at its ``on_train_batch_end``:
    every ``trainer.val_check_interval`` steps (an integer, counted across epochs, one batch a step), and
    when the run is asked to stop (``ValidateAtLastStep``, listed before this callback, asks at the last
    step); the configuration gives every process validation rows (``data.val_size``), so a validation
    step is never skipped for want of data. A validation pass ending at a checkpoint step whose files were
    written before it (a stop asked later in the step) writes them again, so the files of that step always
    hold its validation.

    Writes go through ``trainer.save_checkpoint`` (every process calls it; process 0 writes, through the
    atomic ``checkpoints.AtomicCheckpointIO``): the step file first, then ``last.ckpt``. A step file already
    in the folder that this process did not write is never replaced: the new one gets ``-v1`` (``-v2``, ...), as
    ``ModelCheckpoint`` names it. A subclass of Lightning's ``Checkpoint``, so that the Trainer adds no
    checkpoint callback of its own and ``trainer.checkpoint_callback`` is this one.
    """

    def __init__(self, dirpath: Path, every_n_steps: int) -> None:
        self.dirpath = str(dirpath)
        self.every_n_steps = every_n_steps
        self.written: list[Path] = []  # the step files this process wrote, in order
        self._written_at: int | None = None  # the step of the last write

    def setup(self, trainer, pl_module, stage) -> None:
        # process 0's folder on every process, so that every process names the files process 0 writes
        self.dirpath = trainer.strategy.broadcast(self.dirpath)

    def _due(self, trainer) -> bool:
        return (
            trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and trainer.global_step > 0
            and trainer.global_step % self.every_n_steps == 0
        )

    @staticmethod
    def validates_after_this_step(trainer) -> bool:
        """Whether Lightning runs a validation pass after the training step that has just ended."""
        if not trainer.enable_validation:
            return False
        interval = trainer.val_check_interval
        return trainer.should_stop or (isinstance(interval, int) and trainer.global_step % interval == 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._due(trainer) and not self.validates_after_this_step(trainer):
            self._write(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._due(trainer):
            self._write(trainer)

    def _write(self, trainer) -> None:
        step = trainer.global_step
        folder = Path(self.dirpath)
        if self._written_at == step:  # written before a validation pass this step turned out to have
            path = self.written[-1]
        else:
            path, version = folder / f"step{step:05d}.ckpt", 0
            while trainer.strategy.broadcast(path.exists()):
                version += 1
                path = folder / f"step{step:05d}-v{version}.ckpt"
            self.written.append(path)
            self._written_at = step
        trainer.save_checkpoint(path, weights_only=False)
        trainer.save_checkpoint(folder / "last.ckpt", weights_only=False)


class Stopped(BaseException):
    """SIGINT or SIGTERM where a run stops at once (set-up, its first training step and the compilation
    in it, the final test, the summary): raised where the process is, so that it ends with one line. A
    ``BaseException``: no job runner or library handler takes it for a failure of its own and carries on."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class Interrupted(RuntimeError):
    """A run stopped by SIGTERM or SIGINT after ``last.ckpt`` was written at the step it reached."""

    def __init__(self, signal_name: str, checkpoint: Path, step: int) -> None:
        super().__init__(f"stopped by {signal_name} at step {step}; {checkpoint} holds that step")
        self.signal_name, self.checkpoint, self.step = signal_name, checkpoint, step


class SaveOnSignal(L.Callback):
    """On SIGTERM (and SIGINT, see ``sigint_as_sigterm``), ``last.ckpt`` at the step the run reached.

    Lightning's own SIGTERM handling sets ``Trainer.received_sigterm`` and stops the run once the
    current step has ended (its checkpoints written, its validation run), by raising an exception that
    every process sees: this callback's ``on_exception`` writes ``last.ckpt`` then, through the
    trainer's (atomic) checkpoint I/O, the same way as the periodic checkpoints. On SLURM, Lightning's
    requeue signal and its handling stay as they are.

    Lightning would stop a validation pass mid-way (it checks after each validation batch, also when the
    signal came during the training step before it), and the resumed run would not repeat it; the calls
    of the part it ran would count as training calls. So while training (and validating), SIGTERM is
    held, and handed to Lightning's handler once the step is over: at its end when no validation follows
    it (``StepCheckpoints.validates_after_this_step``), else when the validation pass ends. The run then
    stops at once, with that step's validation loss logged. A signal that comes after this callback's
    end-of-step hook (during the module's own) is handed over at the end of the next step.
    """

    def __init__(self, checkpoint_dir: Path) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.signal_name = "SIGTERM"  # sigint_as_sigterm says when it was SIGINT
        self.saved: Path | None = None
        self.step = 0
        self._handler = None  # the SIGTERM handler held back during validation
        self._held: int | None = None
        self._stopping = False  # a held signal went to Lightning: later ones stay held to the end
        self.late: str | None = None  # a signal Lightning's loops no longer act on (``outside_hold``)
        # Until this process's first training step has ended, a signal stops the run at once (``Stopped``):
        # Lightning's set-up, the sanity check and the first step, which compiles the network under
        # compile=true, can take long, and they hold nothing a checkpoint would keep.
        self.at_once = True

    def outside_hold(self, signum, frame) -> None:
        """SIGTERM's handler around ``Trainer.fit`` and the run's end (``run.sigterm_left_to_lightning``),
        which Lightning's handler also calls: the signal is recorded in ``late``. A signal Lightning acts
        on stops the run with ``last.ckpt`` (``on_exception``); one that comes after its loops' last check
        (in ``on_train_end``, or once ``Trainer.fit`` has returned) is honoured once ``final.ckpt`` and
        ``last.ckpt`` are written."""
        name = self.signal_name if signum == signal.SIGTERM else signal.Signals(signum).name
        if self.late is None:
            self.late = name
        if self.at_once:
            raise Stopped(name)

    def _hold(self) -> None:
        """From now on SIGTERM is recorded, not handled (main thread only: Python runs handlers there)."""
        if self._handler is not None or threading.current_thread() is not threading.main_thread():
            return

        def hold(signum, frame):
            self._held = signum  # kept also when raised at once: code that swallows the exception ends its step
            if self.at_once:
                raise Stopped(self.signal_name if signum == signal.SIGTERM else signal.Signals(signum).name)

        self._held = None
        self._handler = signal.signal(signal.SIGTERM, hold)

    def _hand_over(self, trainer, end_hold: bool) -> None:
        """At a point every process reaches together (a step's end, a validation pass's end, the end of
        training): if any process holds a SIGTERM, every process hands one to Lightning's handler now, once,
        and keeps holding any later one; else, with ``end_hold``, Lightning's handler is put back.

        Why together: under data parallelism Lightning's handler takes part in a collective (a broadcast
        from process 0), and process 0's forwards the signal to the others. Handed over where each process
        happened to receive it (Ctrl+C reaches every process; process 0 sends a second one), the handlers'
        broadcasts would not match and the processes would wait for each other for ever. So the processes
        first agree (a max over them of "holds a signal": one small all-reduce a step, where Lightning
        itself synchronises every step), then each calls the handler once at the same point. A signal that
        arrives after that, process 0's forwarded one included, lands on the hold, which stays until the
        run's end."""
        if self._handler is None:
            return
        stop = self._held is not None
        if trainer.world_size > 1:
            flag = torch.tensor([1.0 if stop else 0.0], device=trainer.strategy.root_device)
            stop = bool(trainer.strategy.reduce(flag, reduce_op="max").item())
        if stop:
            self._held, self._stopping = None, True
            if callable(self._handler):
                self._handler(signal.SIGTERM, None)  # Lightning's: it stops the run at this step's end
            else:  # no handler of Lightning's (the default action, or ignored): as if never held
                signal.signal(signal.SIGTERM, self._handler)
                self._handler = None
                os.kill(os.getpid(), signal.SIGTERM)
            return
        if end_hold:
            signal.signal(signal.SIGTERM, self._handler)
            self._handler = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._hold()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.at_once = False
        if not StepCheckpoints.validates_after_this_step(trainer):
            self._hand_over(trainer, end_hold=False)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._hold()  # the sanity check's pass, before training; during training the hold is on already

    def on_validation_end(self, trainer, pl_module) -> None:
        self._hand_over(trainer, end_hold=trainer.sanity_checking)

    def on_train_end(self, trainer, pl_module) -> None:
        self._hand_over(trainer, end_hold=True)

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self._handler is not None and not self._stopping:  # stopped during validation by something else
            signal.signal(signal.SIGTERM, self._handler)
            self._handler = None
        if not trainer.received_sigterm or isinstance(exception, Stopped):
            return  # Stopped: before the first step's end, nothing to keep
        # The checkpoint callback's folder is process 0's on every process (Lightning broadcasts it), so the
        # line each process prints names the file process 0 writes.
        checkpoint_callback = trainer.checkpoint_callback
        folder = (
            Path(checkpoint_callback.dirpath)
            if checkpoint_callback and checkpoint_callback.dirpath
            else self.checkpoint_dir
        )
        path = folder / "last.ckpt"
        trainer.save_checkpoint(path, weights_only=False)
        self.saved, self.step = path, trainer.global_step


@contextlib.contextmanager
def sigint_as_sigterm(callback: SaveOnSignal):
    """While training, SIGINT (Ctrl+C) stops the run as SIGTERM does: at the end of the current step,
    with ``last.ckpt`` written, rather than by ``KeyboardInterrupt`` wherever the interpreter happens to
    be (mid-step, mid-write). Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if callback.at_once:
            raise Stopped("SIGINT")
        callback.signal_name = "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)

    named = SignalNamed(callback)
    lightning_log = logging.getLogger(LIGHTNING_SIGNAL_LOGGER)
    lightning_log.addFilter(named)
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        lightning_log.removeFilter(named)


#: The logger of Lightning's SIGTERM handling, which announces each signal it is handed as
#: ``Received SIGTERM: 15``.
LIGHTNING_SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"


class SignalNamed(logging.Filter):
    """Lightning announces every signal it is handed as SIGTERM; Ctrl+C reaches it as one
    (``sigint_as_sigterm``). This filter gives the announcement the signal that came."""

    def __init__(self, callback: SaveOnSignal) -> None:
        super().__init__()
        self.callback = callback

    def filter(self, record: logging.LogRecord) -> bool:
        name = self.callback.signal_name
        message = record.getMessage()
        sigterm = f"Received SIGTERM: {signal.SIGTERM.value}"
        if name != "SIGTERM" and sigterm in message:
            record.msg, record.args = message.replace(sigterm, f"Received {name}: {signal.Signals[name].value}"), ()
        return True
