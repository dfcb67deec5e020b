"""The initial-parity check: on the first training batch, both RMSNorm paths from the same weights."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from ..ops.impls import IMPLS
from ..ops.tolerances import compare
from .model import build_network


class InitialParity(L.Callback):
    """On the first training batch, runs both paths from the module's initial weights and compares them.

    Outputs and gradients must agree within the tolerance of ``ops/tolerances.py`` for their dtype.
    A resumed run starts past step 0 and measures nothing (the run it resumes measured at step 0).
    """

    def __init__(self) -> None:
        self.output_err: float | None = None
        self.grad_err: float | None = None
        self.dtype: torch.dtype | None = None  # of the compared outputs: it picks the tolerance
        self.ok = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != 0 or self.output_err is not None:
            return
        x, y = batch
        outs, grads = {}, {}
        for impl in IMPLS:
            net = build_network(**{**pl_module.network_kwargs(), "norm_impl": impl}).to(x.device)
            net.load_state_dict(pl_module.net.state_dict())
            out = net(x)
            grads[impl] = torch.autograd.grad(F.mse_loss(out, y), list(net.parameters()))
            outs[impl] = out.detach()
        self.dtype = outs["reference"].dtype
        self.output_err = float((outs["triton"] - outs["reference"]).abs().max())
        self.grad_err = max(float((a - b).abs().max()) for a, b in zip(grads["triton"], grads["reference"]))
        self.ok = compare(outs["triton"], outs["reference"]).ok and all(
            compare(a, b).ok for a, b in zip(grads["triton"], grads["reference"])
        )
        if trainer.logger is not None:
            trainer.logger.log_metrics(
                {"parity/initial_output_err": self.output_err, "parity/initial_grad_err": self.grad_err}, step=0
            )
