"""The network Linear -> RMSNorm -> SiLU -> Linear and the LightningModule that trains it with MSE and Adam."""

from __future__ import annotations

from collections import OrderedDict

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from .module import RMSNorm
from .op import call_counts

#: The constructor arguments of ``build_network``, as saved in a checkpoint's hyper-parameters.
NETWORK_KEYS = ("input_dim", "hidden_dim", "output_dim", "norm_impl", "eps")


def build_network(input_dim: int, hidden_dim: int, output_dim: int, norm_impl: str, eps: float) -> nn.Sequential:
    """Linear(input_dim, N) -> RMSNorm(N) -> SiLU -> Linear(N, output_dim), with N = hidden_dim."""
    return nn.Sequential(
        OrderedDict(
            inp=nn.Linear(input_dim, hidden_dim),
            norm=RMSNorm(hidden_dim, eps=eps, impl=norm_impl),
            act=nn.SiLU(),
            out=nn.Linear(hidden_dim, output_dim),
        )
    )


class RMSNormRegressor(L.LightningModule):
    """Regression with MSE and Adam; counts the Triton path's calls per stage.

    The counters of ``rmsnorm_kernel.call_counts()`` are read around each training forward and each
    backward, and around each validation and test forward, so the training counts hold exactly the
    calls that training made (one forward and one backward per step on the Triton path), apart from
    evaluation and from anything a callback runs.
    """

    def __init__(
        self, input_dim: int, hidden_dim: int, output_dim: int, norm_impl: str, eps: float, lr: float
    ) -> None:
        super().__init__()
        # Logged by hand at the end of a run, with test/mse as the HPARAMS metric.
        self.save_hyperparameters(logger=False)
        self.net = build_network(input_dim, hidden_dim, output_dim, norm_impl, eps)
        self.calls = {"train/forward": 0, "train/backward": 0, "val/forward": 0, "test/forward": 0}
        self._test_sq_err = 0.0
        self._test_count = 0
        self.test_mse: float | None = None

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
        pred = self._counted("train/forward", self.net, x)
        loss = F.mse_loss(pred.float(), y)
        self.log("train/mse", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self._backward_start = call_counts()["backward"]

    def on_after_backward(self) -> None:
        self.calls["train/backward"] += call_counts()["backward"] - self._backward_start

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.log("calls/forward", float(self.calls["train/forward"]), on_step=True, on_epoch=False)
        self.log("calls/backward", float(self.calls["train/backward"]), on_step=True, on_epoch=False)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self._counted("val/forward", self.net, x)
        self.log("val/mse", F.mse_loss(pred.float(), y), on_step=False, on_epoch=True, prog_bar=True)

    def on_test_epoch_start(self) -> None:
        self._test_sq_err, self._test_count = 0.0, 0

    def test_step(self, batch, batch_idx):
        x, y = batch
        pred = self._counted("test/forward", self.net, x)
        # Summed here and divided once at the end: the exact MSE of the split, whatever the batch sizes.
        self._test_sq_err += float((pred.float() - y).pow(2).sum())
        self._test_count += y.numel()

    def on_test_epoch_end(self) -> None:
        self.test_mse = self._test_sq_err / self._test_count
        self.log("test/mse", self.test_mse)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
