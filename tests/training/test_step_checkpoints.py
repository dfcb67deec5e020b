"""The periodic checkpoints in this process, driven by a stand-in trainer: each written after its step's
validation, never over another run's file; and the validation asked at a run's last step."""

from types import SimpleNamespace

import pytest

from rmsnorm_kernel.training.step_checkpoints import StepCheckpoints, ValidateAtLastStep


@pytest.mark.parametrize(("global_step", "stops"), [(3, False), (4, True)])
def test_the_last_step_asks_lightning_to_stop_and_so_to_validate(global_step, stops):
    trainer = SimpleNamespace(global_step=global_step, max_steps=4, should_stop=False)
    ValidateAtLastStep().on_train_batch_end(trainer, None, None, None, 0)
    assert trainer.should_stop is stops


class CheckpointTrainer(SimpleNamespace):
    """A stand-in trainer for StepCheckpoints: one process, validation every ``val_check_interval`` steps;
    it records each checkpoint written with the step and the validations run by then."""

    def __init__(self, folder):
        from lightning.pytorch.trainer.states import TrainerFn

        super().__init__(
            state=SimpleNamespace(fn=TrainerFn.FITTING),
            sanity_checking=False,
            enable_validation=True,
            val_check_interval=3,
            should_stop=False,
            global_step=0,
            strategy=SimpleNamespace(broadcast=lambda obj: obj),
            validated=[],
            saved=[],
        )
        self.folder = folder

    def save_checkpoint(self, path, weights_only):
        assert weights_only is False
        self.saved.append((path.name, self.global_step, list(self.validated)))
        path.write_bytes(b"")

    def step(self, callback, stop_later=False):
        """One training step's hooks, then its validation if Lightning would run one."""
        self.global_step += 1
        callback.on_train_batch_end(self, None, None, None, 0)
        self.should_stop = self.should_stop or stop_later  # asked after the checkpoint callback's hook
        if self.global_step % self.val_check_interval == 0 or self.should_stop:
            self.validated.append(self.global_step)
            callback.on_validation_end(self, None)


def test_a_validation_steps_checkpoint_is_written_after_its_validation(tmp_path):
    trainer = CheckpointTrainer(tmp_path)  # validation every 3 steps
    callback = StepCheckpoints(tmp_path, every_n_steps=2)
    callback.setup(trainer, None, "fit")
    trainer.sanity_checking = True
    callback.on_validation_end(trainer, None)  # the sanity check writes nothing
    trainer.sanity_checking = False
    (tmp_path / "step00004.ckpt").write_bytes(b"another run's")  # never replaced
    for _ in range(7):
        trainer.step(callback)
    trainer.should_stop = True  # asked at the last step (ValidateAtLastStep): Lightning validates it
    trainer.step(callback)
    trainer.should_stop = False
    trainer.step(callback)
    trainer.step(callback, stop_later=True)  # a stop asked after the step's files were written
    assert trainer.saved == [
        ("step00002.ckpt", 2, []),  # not a validation step: at its end
        ("last.ckpt", 2, []),
        ("step00004-v1.ckpt", 4, [3]),
        ("last.ckpt", 4, [3]),
        ("step00006.ckpt", 6, [3, 6]),  # after its validation
        ("last.ckpt", 6, [3, 6]),
        ("step00008.ckpt", 8, [3, 6, 8]),
        ("last.ckpt", 8, [3, 6, 8]),
        ("step00010.ckpt", 10, [3, 6, 8, 9]),
        ("last.ckpt", 10, [3, 6, 8, 9]),
        ("step00010.ckpt", 10, [3, 6, 8, 9, 10]),  # written again, with its validation
        ("last.ckpt", 10, [3, 6, 8, 9, 10]),
    ]
    assert (tmp_path / "step00004.ckpt").read_bytes() == b"another run's"
    names = ("step00002.ckpt", "step00004-v1.ckpt", "step00006.ckpt", "step00008.ckpt", "step00010.ckpt")
    assert callback.written == [tmp_path / name for name in names]
