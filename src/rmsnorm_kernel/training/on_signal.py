"""``last.ckpt`` at the step a run reached when SIGTERM or SIGINT stops it (``SaveOnSignal``), and the
exception that reports that stop (``Interrupted``). What each signal does when is ``signals.py``'s."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from ..signals import SigtermHold, Stopped
from .step_checkpoints import StepCheckpoints


class Interrupted(RuntimeError):
    """A run stopped by SIGTERM or SIGINT after ``last.ckpt`` was written at the step it reached."""

    def __init__(self, signal_name: str, checkpoint: Path, step: int) -> None:
        super().__init__(f"stopped by {signal_name} at step {step}; {checkpoint} holds that step")
        self.signal_name, self.checkpoint, self.step = signal_name, checkpoint, step


class SaveOnSignal(SigtermHold, L.Callback):
    """On SIGTERM (and SIGINT, see ``signals.sigint_as_sigterm``), ``last.ckpt`` at the step the run reached.

    Lightning's own SIGTERM handling sets ``Trainer.received_sigterm`` and stops the run once the
    current step has ended (its checkpoints written, its validation run), by raising an exception that
    every process sees: this callback's ``on_exception`` writes ``last.ckpt`` then, through the
    trainer's (atomic) checkpoint I/O, the same way as the periodic checkpoints. On SLURM, Lightning's
    requeue signal and its handling stay as they are.

    Lightning would stop a validation pass mid-way (it checks after each validation batch, also when the
    signal came during the training step before it), and the resumed run would not repeat it; the calls
    of the part it ran would count as training calls. So while training (and validating), SIGTERM is
    held (``signals.SigtermHold``), and handed to Lightning's handler once the step is over: at its end
    when no validation follows it (``StepCheckpoints.validates_after_this_step``), else when the
    validation pass ends. The run then stops at once, with that step's validation loss logged. A signal
    that comes after this callback's end-of-step hook (during the module's own) is handed over at the end
    of the next step. Until this process's first training step has ended, a signal stops the run at once
    (``at_once``).
    """

    def __init__(self, checkpoint_dir: Path) -> None:
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self.saved: Path | None = None
        self.step = 0

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
        if not self.holding:
            return
        stop = self.held
        if trainer.world_size > 1:
            flag = torch.tensor([1.0 if stop else 0.0], device=trainer.strategy.root_device)
            stop = bool(trainer.strategy.reduce(flag, reduce_op="max").item())
        self.hand_over(stop, end_hold)

    def on_train_start(self, trainer, pl_module) -> None:
        self.hold()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.at_once = False
        if not StepCheckpoints.validates_after_this_step(trainer):
            self._hand_over(trainer, end_hold=False)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.hold()  # the sanity check's pass, before training; during training the hold is on already

    def on_validation_end(self, trainer, pl_module) -> None:
        self._hand_over(trainer, end_hold=trainer.sanity_checking)

    def on_train_end(self, trainer, pl_module) -> None:
        self._hand_over(trainer, end_hold=True)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.release_unless_stopping()  # stopped during validation by something else
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
