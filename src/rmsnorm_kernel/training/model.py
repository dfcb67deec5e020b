"""The LightningModule that trains the demo networks (``network.build_network``) with Adam: the regression
with its MSE, the language model with the cross-entropy of the next byte."""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from ..ops.backend import kernel_device_type
from ..ops.contract import ContractError, check_forward
from ..ops.counters import call_counts
from .network import (
    LOSS_NAMES,
    NETWORK_KEYS,
    build_network,
    fallback_count,
    loss,
    network_copy,
    network_input,
    norm_layers,
    sharded,
)

#: Test-split rows whose outputs every checkpoint records, so an audit can re-run the saved network: 64
#: rows of the regression, 4 windows of the language model (whose outputs are seq_len x 256 logits each).
PROBE_ROWS = {"mlp": 64, "transformer": 4}


class TrainingStopped(RuntimeError):
    """A check during training stopped the run, before any checkpoint held what it found."""


class NonFiniteLossError(TrainingStopped):
    """The training loss became NaN or infinite; raised at the next reading of the step losses
    (``RMSNormRegressor.flush_step_metrics``), before any checkpoint holds a weight the bad step changed."""


class RMSNormRegressor(L.LightningModule):
    """The network of ``kind`` trained with Adam on its loss (``network.loss``): the MSE of the
    regression (``mlp``), logged as ``train/mse``, ``val/mse``, ``test/mse``; the cross-entropy of the
    language model (``transformer``), logged as ``train/loss``, ``val/loss``, ``test/loss``, with the
    perplexity of validation and test (``val/ppl``, ``test/ppl``). Counts the Triton path's calls per stage.

    A training step waits for nothing on the device: its loss, its finiteness and the Triton calls it
    made are read together every ``trainer.log_every_n_steps`` steps, before every checkpoint and at the
    end of training (``flush_step_metrics``), one wait each time.

    Calls are counted by settlement (``settle_calls``): the kernels' own counters
    (``rmsnorm_kernel.call_counts()``) are read at the edges of every other activity that may run the
    Triton path (validation, test, ``parity.Parity``, the probe outputs a checkpoint records), and the
    calls since the previous reading go to the stage that ran in between. Between those edges only
    training steps run, so the training counts hold exactly the calls training made (on the Triton path,
    one forward and one backward per norm layer call in a step: ``network.norm_calls_per_step``). Counts
    are per process: under data parallelism each process counts its own calls, and the logged ``calls/*``
    values, like the summary's, are those of process 0 (each process runs every step, so its training
    counts equal the steps trained times the norm calls of a step).

    The counts and the first fallback reason ride in every checkpoint, so a resumed run's counts are
    those of the whole history. A checkpoint without them (written before they were saved) leaves
    ``calls_unknown_before`` at the step it holds: the counts of the steps before it are unknown, and the
    run's integration check fails saying so rather than comparing a part with the whole.

    ``train/mse`` (``train/loss``) is the loss of the global batch (all processes' rows), the same value in
    TensorBoard, in ``trainer.callback_metrics`` and so in the summary. A non-finite one stops the run at the next
    reading, naming its step; no checkpoint holds a weight that a step after it changed, since every
    checkpoint reads first.
    """

    def __init__(
        self,
        input_dim: int | None,
        hidden_dim: int | None,
        output_dim: int | None,
        norm_impl: str,
        eps: float,
        lr: float,
        norm_fallback: str | None = None,
        dtype: str = "float32",
        kind: str = "mlp",
        dim: int | None = None,
        layers: int | None = None,
        heads: int | None = None,
        mlp_hidden: int | None = None,
        seq_len: int | None = None,
        qk_norm: bool | None = None,
    ) -> None:
        super().__init__()
        # Logged by hand at the end of a run, with the test loss as the HPARAMS metric.
        self.save_hyperparameters(logger=False)
        self.net = build_network(**self.network_kwargs())
        self.loss_name = LOSS_NAMES[kind]
        self.calls = {
            "train/forward": 0,
            "train/backward": 0,
            "train/fallback": 0,
            "val/forward": 0,
            "test/forward": 0,
            "parity/forward": 0,
            "parity/backward": 0,  # parity.Parity's own Triton calls
        }
        self._test_sum = 0.0
        self._test_count = 0
        self.test_loss: float | None = None
        self.fallback_reason: str | None = None  # why the first training step sent to the reference went there
        self.calls_unknown_before: int | None = None  # resumed at this step from a checkpoint without counts
        self._settled: dict[str, int] | None = None  # call_counts() at the last settlement
        self._pending_loss: list[tuple[int, torch.Tensor]] = []  # (step, global-batch loss) not yet read

    def network_kwargs(self) -> dict:
        return {k: self.hparams[k] for k in NETWORK_KEYS}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def configure_model(self) -> None:
        """Under ``trainer.strategy=fsdp2`` (Lightning's ``ModelParallelStrategy``, which gives the module a
        device mesh): FSDP2, ``fully_shard`` on each block of the language model, then on the whole
        network, so that each process holds a shard of every parameter and gathers one block's at a time.
        Under every other strategy, nothing."""
        if self.device_mesh is None or sharded(self.net):
            return  # not FSDP, or sharded already (Lightning calls this hook again to test after fitting)
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in getattr(self.net, "blocks", ()):
            fully_shard(block, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def settle_calls(self, stage: str | None) -> None:
        """Add the Triton calls made since the last settlement to ``stage``'s counts (``"train"``, ``"val"``,
        ``"test"``, ``"parity"``), or to none (``None``: calls that are not counted). Waits for the device."""
        now = call_counts()
        if self._settled is not None and stage is not None:
            for direction in ("forward", "backward"):
                key = f"{stage}/{direction}"
                self.calls[key] = self.calls.get(key, 0) + now[direction] - self._settled[direction]
        self._settled = now

    def on_fit_start(self) -> None:
        self.settle_calls(None)

    def training_step(self, batch, batch_idx):
        x, y = batch
        fallbacks = fallback_count(self.net)
        pred = self.net(x)
        fell_back = fallback_count(self.net) - fallbacks
        self.calls["train/fallback"] += fell_back
        if fell_back and self.fallback_reason is None:
            self.fallback_reason = self._refusal(x)
        step_loss = loss(self.hparams.kind, pred, y)
        # The loss of the global batch: under data parallelism each process holds an equal share of it.
        # (A copy: the all-reduce works in place and must not touch the loss that backward will use.)
        reduced = self.trainer.strategy.reduce(step_loss.detach().clone(), reduce_op="mean")
        self._pending_loss.append((self.global_step, reduced))  # read later, without waiting now
        return step_loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        step = self.global_step  # counts the step that just ended
        if step % self.trainer.log_every_n_steps == 0 or step >= self.trainer.max_steps:
            self.flush_step_metrics(progress_bar=True)

    def on_train_end(self) -> None:
        self.flush_step_metrics()

    def flush_step_metrics(self, progress_bar: bool = False) -> None:
        """Read the losses of the steps since the last reading (one wait for the device), stop the run at
        the first that is not finite, log them at their steps, and settle the training calls.

        Called every ``trainer.log_every_n_steps`` steps, before each checkpoint and at the end of training.
        The same values on every process (global-batch losses), so every process stops at the same reading."""
        pending, self._pending_loss = self._pending_loss, []
        tag = f"train/{self.loss_name}"
        if pending:
            values = torch.stack([value for _, value in pending]).tolist()
            bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
            if bad is not None:
                raise NonFiniteLossError(
                    f"{tag} is {values[bad]} at step {pending[bad][0]}, read at step {self.global_step} (losses "
                    f"are read every {self.trainer.log_every_n_steps} steps and before each checkpoint); no "
                    "checkpoint holds a weight changed after it"
                )
            if self.logger is not None:
                for (step, _), value in zip(pending, values):
                    self.logger.log_metrics({tag: value}, step=step)
            if progress_bar:
                self.log(tag, values[-1], prog_bar=True, logger=False)
        self.settle_calls("train")  # only training steps run between settlements
        if self.logger is not None and pending:
            self.logger.log_metrics(
                {f"calls/{k}": float(self.calls[f"train/{k}"]) for k in ("forward", "backward", "fallback")},
                step=pending[-1][0],
            )

    def _refusal(self, x: torch.Tensor) -> str:
        """The Triton contract's reason for refusing the input of the first norm layer it refuses on batch
        ``x``, with the layer's name when the network has several."""
        reasons = []

        def check(name, module, args):
            if not reasons:
                try:
                    check_forward(args[0], module.weight, module.eps)
                except ContractError as e:
                    reasons.append(str(e) if name == "norm" else f"{name}: {e}")

        layers = norm_layers(self.net)
        hooks = [m.register_forward_pre_hook(lambda m, args, name=name: check(name, m, args)) for name, m in layers]
        try:
            with torch.no_grad():
                self.net(x)
        finally:
            for hook in hooks:
                hook.remove()
        return reasons[0] if reasons else "the contract accepts this input"

    def evaluation_metrics(self, stage: str, value: float) -> dict[str, float]:
        """``<stage>/<loss>``, and for the language model ``<stage>/ppl``, its perplexity."""
        metrics = {f"{stage}/{self.loss_name}": value}
        if self.hparams.kind == "transformer":
            metrics[f"{stage}/ppl"] = math.exp(min(value, 700.0))  # exp overflows a float past 709
        return metrics

    def on_validation_epoch_start(self) -> None:
        self.settle_calls("train")
        self._val_sum, self._val_count = 0.0, 0

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self.net(x)
        self._val_sum += float(loss(self.hparams.kind, pred, y, reduction="sum"))
        self._val_count += y.numel()

    def on_validation_epoch_end(self) -> None:
        self.settle_calls("val")
        metrics = self.evaluation_metrics("val", self._exact_mean(self._val_sum, self._val_count))
        for tag, value in metrics.items():
            self.log(tag, value, prog_bar=tag.endswith(self.loss_name), logger=False)
        # To the logger at the step of the last training step, given here rather than taken from
        # Lightning's loop counters: a run resumed after a signal logs at the same steps.
        if self.logger is not None and not self.trainer.sanity_checking:
            self.logger.log_metrics(metrics, step=self.global_step - 1)

    def _exact_mean(self, total: float, count: int) -> float:
        """The loss over every process's rows: the summed losses and the counts, reduced.
        (Each process holds a disjoint slice of the split: ``SplitData.shard``.)"""
        totals = torch.tensor([total, float(count)], dtype=torch.float64, device=self.device)
        total, count = self.trainer.strategy.reduce(totals, reduce_op="sum").tolist()
        return total / count

    def on_test_epoch_start(self) -> None:
        self.settle_calls(None)
        self._test_sum, self._test_count = 0.0, 0

    def test_step(self, batch, batch_idx):
        x, y = batch
        pred = self.net(x)
        # Summed here and divided once at the end: the exact loss of the split, whatever the batch sizes.
        self._test_sum += float(loss(self.hparams.kind, pred, y, reduction="sum"))
        self._test_count += y.numel()

    def on_test_epoch_end(self) -> None:
        self.settle_calls("test")
        self.test_loss = self._exact_mean(self._test_sum, self._test_count)
        metrics = self.evaluation_metrics("test", self.test_loss)
        for tag, value in metrics.items():
            self.log(tag, value, logger=False)  # equal on every process already
        if self.logger is not None:  # at the last step, whatever Lightning's loop counters say (see above)
            self.logger.log_metrics(metrics, step=self.global_step)

    def _fitting(self) -> bool:
        """Whether a Trainer is fitting this module (``self.trainer`` raises when none is attached)."""
        try:
            return self.trainer.state.fn == TrainerFn.FITTING
        except RuntimeError:
            return False

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self._fitting():
            self.flush_step_metrics()  # every step's loss read and logged, and found finite, before it is saved
        # Random generators: nothing in this network draws from them during training today, but a resumed
        # run must continue every stream exactly where the interrupted one stopped.
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng"] = rng
        checkpoint["calls"] = dict(self.calls)  # a resumed run keeps counting from here
        if self.calls_unknown_before is not None:
            checkpoint["calls_unknown_before"] = self.calls_unknown_before
        if self.fallback_reason is not None:
            checkpoint["fallback_reason"] = self.fallback_reason
        if self.logger is not None:
            self.logger.save()  # every scalar up to this checkpoint reaches the disk with it
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            x = network_input(self.net, datamodule.test.tensors[0][: PROBE_ROWS[self.hparams.kind]])
            was_training = self.net.training
            self.net.eval()
            with torch.no_grad():
                # Recorded where the kernels run, on either path, so that a reload there (check-checkpoints,
                # the tests) reproduces these bits. Lightning hands the module back on the CPU after fit:
                # then the saved weights run there without moving the module itself, with every buffer (the
                # state dict leaves out the language model's rotary tables, which are not saved).
                if sharded(self.net):  # FSDP2: a whole copy, built on every process (the gather is collective)
                    copy = network_copy(self.net, **self.network_kwargs()).to(self.device)
                    out = copy.eval()(x.to(self.device))
                elif self.device.type != kernel_device_type():
                    device = torch.device(kernel_device_type())
                    tensors = {**dict(self.net.named_parameters()), **dict(self.net.named_buffers())}
                    out = torch.func.functional_call(
                        self.net, {k: v.to(device) for k, v in tensors.items()}, (x.to(device),)
                    )
                else:
                    out = self.net.forward(x.to(self.device))  # eager, also when compiled
            out = out.float().cpu()
            self.net.train(was_training)
            if self._settled is not None:
                self.settle_calls(None)  # the probe's own calls are not counted
            checkpoint["rmsnorm_kernel"] = {"test_inputs": x.clone(), "test_outputs": out}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "calls" in checkpoint:
            self.calls.update(checkpoint["calls"])
            self.calls_unknown_before = checkpoint.get("calls_unknown_before")
        else:
            self.calls_unknown_before = checkpoint.get("global_step", 0)
        self.fallback_reason = checkpoint.get("fallback_reason", self.fallback_reason)
        rng = checkpoint.get("rng")
        if rng is not None:
            # .cpu(): a checkpoint loaded with map_location="cuda" moves these byte tensors too
            torch.set_rng_state(rng["torch"].cpu())
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([state.cpu() for state in rng["cuda"]])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
