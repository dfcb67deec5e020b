"""The progress bar of a run, counting its training steps (``StepProgressBar``)."""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar


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
