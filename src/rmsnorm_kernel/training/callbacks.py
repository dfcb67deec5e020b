"""The initial-parity check (on the first training batch, both RMSNorm paths from the same weights), and
``last.ckpt`` written when a signal stops the run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from ..ops.contract import ContractError
from ..ops.impls import IMPLS
from ..ops.tolerances import compare
from .model import build_network


class InitialParity(L.Callback):
    """On the first training batch, runs both paths from the module's initial weights and compares them.

    Outputs and gradients must agree within the tolerance of ``ops/tolerances.py`` for their dtype.
    A resumed run starts past step 0 and measures nothing (the run it resumes measured at step 0).
    The Triton path runs here without a fallback, so the comparison is always with Triton: when its
    contract refuses the batch, nothing is compared and ``skipped`` holds the contract's reason (the run
    itself goes on with its own path: the reference, or a Triton path with ``norm.fallback=reference``).
    """

    def __init__(self) -> None:
        self.output_err: float | None = None
        self.grad_err: float | None = None
        self.dtype: torch.dtype | None = None  # of the compared outputs: it picks the tolerance
        self.ok = True
        self.skipped: str | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != 0 or self.output_err is not None or self.skipped is not None:
            return
        x, y = batch
        outs, grads = {}, {}
        for impl in IMPLS:
            net = build_network(**{**pl_module.network_kwargs(), "norm_impl": impl, "norm_fallback": None}).to(x.device)
            net.load_state_dict(pl_module.net.state_dict())
            try:
                out = net(x)
            except ContractError as e:
                self.skipped = f"the Triton contract refuses this shape ({e})"
                return
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

    Lightning would stop a validation pass mid-way (it checks after each validation batch), and the
    resumed run would not repeat it: so during validation SIGTERM is held, and handed to Lightning's
    handler when the pass ends. The run then stops at once, with that step's ``val/mse`` logged.
    """

    def __init__(self, checkpoint_dir: Path) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.signal_name = "SIGTERM"  # sigint_as_sigterm says when it was SIGINT
        self.saved: Path | None = None
        self.step = 0
        self._handler = None  # the SIGTERM handler held back during validation
        self._held: int | None = None

    def on_validation_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def hold(signum, frame):
            self._held = signum

        self._held = None
        self._handler = signal.signal(signal.SIGTERM, hold)

    def _give_back(self) -> None:
        if self._handler is None:
            return
        signal.signal(signal.SIGTERM, self._handler)
        self._handler = None
        if self._held is not None:
            self._held = None
            os.kill(os.getpid(), signal.SIGTERM)  # now Lightning's handler sees it

    def on_validation_end(self, trainer, pl_module) -> None:
        self._give_back()

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self._handler is not None:  # stopped during validation by something else
            signal.signal(signal.SIGTERM, self._handler)
            self._handler = None
        if not trainer.received_sigterm:
            return
        path = self.checkpoint_dir / "last.ckpt"
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
        callback.signal_name = "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
