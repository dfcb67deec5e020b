"""Periodic checkpoints: ``step<NNNNN>.ckpt`` and ``last.ckpt`` every ``checkpoint.every_n_steps`` steps,
each written once its step's work is done (``StepCheckpoints``), and the validation at a run's last step
that it counts on (``ValidateAtLastStep``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn


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
