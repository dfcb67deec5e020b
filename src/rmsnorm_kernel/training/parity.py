"""Parity along a run: every RMSNorm path compared with the reference layer by layer, at step 0 and every
``parity.every_n_steps`` steps (``Parity``), and the names its numbers go by in checkpoints, metrics and
TensorBoard (``parity_name``, ``parity_tag``)."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

import lightning as L
import torch

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
