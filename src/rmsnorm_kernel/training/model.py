"""The LightningModule that trains the demo network (``network.build_network``) with MSE and Adam."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from ..ops.backend import kernel_device_type
from ..ops.contract import ContractError, check_forward
from ..ops.op import call_counts
from .network import NETWORK_KEYS, build_network

#: Test-split rows whose outputs every checkpoint records, so an audit can re-run the saved network.
PROBE_ROWS = 64


class TrainingStopped(RuntimeError):
    """A check during training stopped the run, before the step it found changed any weight."""


class NonFiniteLossError(TrainingStopped):
    """The training loss became NaN or infinite; raised before the bad step updates any weight."""


class RMSNormRegressor(L.LightningModule):
    """Regression with MSE and Adam; counts the Triton path's calls per stage.

    The counters of ``rmsnorm_kernel.call_counts()`` are read around each training forward and each
    backward, and around each validation and test forward, so the training counts hold exactly the
    calls that training made (one forward and one backward per step on the Triton path), apart from
    evaluation and from anything a callback runs. Counts are per process: under data parallelism each
    process counts its own calls, and the logged ``calls/*`` values, like the summary's, are those of
    process 0 (each process runs every step, so its training counts equal the steps trained).

    The counts and the first fallback reason ride in every checkpoint, so a resumed run's counts are
    those of the whole history. A checkpoint without them (written before they were saved) leaves
    ``calls_unknown_before`` at the step it holds: the counts of the steps before it are unknown, and the
    run's integration check fails saying so rather than comparing a part with the whole.

    ``train/mse`` is the MSE of the global batch (all processes' rows), the same value in TensorBoard,
    in ``trainer.callback_metrics`` and so in the summary.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        norm_impl: str,
        eps: float,
        lr: float,
        norm_fallback: str | None = None,
    ) -> None:
        super().__init__()
        # Logged by hand at the end of a run, with test/mse as the HPARAMS metric.
        self.save_hyperparameters(logger=False)
        self.net = build_network(input_dim, hidden_dim, output_dim, norm_impl, eps, norm_fallback)
        self.calls = {
            "train/forward": 0,
            "train/backward": 0,
            "train/fallback": 0,
            "val/forward": 0,
            "test/forward": 0,
            "parity/forward": 0,
            "parity/backward": 0,  # callbacks.Parity's own Triton calls
        }
        self._test_sq_err = 0.0
        self._test_count = 0
        self.test_mse: float | None = None
        self.fallback_reason: str | None = None  # why the first training step sent to the reference went there
        self.calls_unknown_before: int | None = None  # resumed at this step from a checkpoint without counts

    def network_kwargs(self) -> dict:
        return {k: self.hparams[k] for k in NETWORK_KEYS}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _counted(self, key: str, fn, *args):
        before = call_counts()["forward" if key.endswith("forward") else "backward"]
        out = fn(*args)
        after = call_counts()["forward" if key.endswith("forward") else "backward"]
        self.calls[key] += after - before
        return out

    def training_step(self, batch, batch_idx):
        x, y = batch
        fallbacks = self.net.norm.fallback_count
        pred = self._counted("train/forward", self.net, x)
        self.calls["train/fallback"] += self.net.norm.fallback_count - fallbacks
        if self.net.norm.fallback_count > fallbacks and self.fallback_reason is None:
            self.fallback_reason = self._refusal(x)
        loss = F.mse_loss(pred.float(), y)
        # The MSE of the global batch: under data parallelism each process holds an equal share of it.
        # (A copy: the all-reduce works in place and must not touch the loss that backward will use.)
        self._step_mse = self.trainer.strategy.reduce(loss.detach().clone(), reduce_op="mean")
        if not torch.isfinite(self._step_mse):  # the same verdict on every process: none is left waiting
            raise NonFiniteLossError(
                f"train/mse is {self._step_mse.item()} at step {self.global_step}, before that step changed any weight"
            )
        # The global batch's value (not this process's share): what TensorBoard gets and the summary prints.
        self.log("train/mse", self._step_mse, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        return loss

    def _refusal(self, x: torch.Tensor) -> str:
        """The Triton contract's reason for refusing the normalization's input on batch ``x``."""
        with torch.no_grad():
            h = self.net.inp(x)
        try:
            check_forward(h, self.net.norm.weight, self.net.norm.eps)
        except ContractError as e:
            return str(e)
        return "the contract accepts this input"

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self._backward_start = call_counts()["backward"]

    def on_after_backward(self) -> None:
        self.calls["train/backward"] += call_counts()["backward"] - self._backward_start
        # The step's scalars go to the logger here, before the step's checkpoint is written (and the
        # checkpoint flushes them): a run killed after a checkpoint has every step up to it on disk,
        # and its resumption logs every later step once.
        if self.logger is not None:
            self.logger.log_metrics(
                {
                    "train/mse": float(self._step_mse),
                    "calls/forward": float(self.calls["train/forward"]),
                    "calls/backward": float(self.calls["train/backward"]),
                    "calls/fallback": float(self.calls["train/fallback"]),
                },
                step=self.global_step,
            )

    def on_validation_epoch_start(self) -> None:
        self._val_sq_err, self._val_count = 0.0, 0

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self._counted("val/forward", self.net, x)
        self._val_sq_err += float((pred.float() - y).pow(2).sum())
        self._val_count += y.numel()

    def on_validation_epoch_end(self) -> None:
        mse = self._exact_mse(self._val_sq_err, self._val_count)
        self.log("val/mse", mse, prog_bar=True, logger=False)
        # To the logger at the step of the last training step, given here rather than taken from
        # Lightning's loop counters: a run resumed after a signal logs at the same steps.
        if self.logger is not None and not self.trainer.sanity_checking:
            self.logger.log_metrics({"val/mse": mse}, step=self.global_step - 1)

    def _exact_mse(self, sq_err: float, count: int) -> float:
        """The MSE over every process's rows: the sums of squared errors and the counts, reduced.
        (Each process holds a disjoint slice of the split: ``SyntheticRegressionData.shard``.)"""
        totals = torch.tensor([sq_err, float(count)], dtype=torch.float64, device=self.device)
        sq_err, count = self.trainer.strategy.reduce(totals, reduce_op="sum").tolist()
        return sq_err / count

    def on_test_epoch_start(self) -> None:
        self._test_sq_err, self._test_count = 0.0, 0

    def test_step(self, batch, batch_idx):
        x, y = batch
        pred = self._counted("test/forward", self.net, x)
        # Summed here and divided once at the end: the exact MSE of the split, whatever the batch sizes.
        self._test_sq_err += float((pred.float() - y).pow(2).sum())
        self._test_count += y.numel()

    def on_test_epoch_end(self) -> None:
        self.test_mse = self._exact_mse(self._test_sq_err, self._test_count)
        self.log("test/mse", self.test_mse, logger=False)  # equal on every process already
        if self.logger is not None:  # at the last step, whatever Lightning's loop counters say (see above)
            self.logger.log_metrics({"test/mse": self.test_mse}, step=self.global_step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
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
            x = datamodule.test.tensors[0][:PROBE_ROWS]
            was_training = self.net.training
            self.net.eval()
            with torch.no_grad():
                # Recorded where the kernels run, on either path, so that a reload there (check-checkpoints,
                # the tests) reproduces these bits. Lightning hands the module back on the CPU after fit:
                # then the saved weights run there without moving the module itself.
                if self.device.type != kernel_device_type():
                    device = torch.device(kernel_device_type())
                    params = {k: v.to(device) for k, v in self.net.state_dict().items()}
                    out = torch.func.functional_call(self.net, params, (x.to(device),))
                else:
                    out = self.net.forward(x.to(self.device))  # eager, also when compiled
            out = out.float().cpu()
            self.net.train(was_training)
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
