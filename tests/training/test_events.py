"""Reading a run's TensorBoard events back: every scalar once, in the order the files were written."""

from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from torch.utils.tensorboard import SummaryWriter

from rmsnorm_kernel.training.events import creation_order, read_scalars


def _event_file(folder: Path, name: str, scalars: list[tuple[str, int, float]], restart_at: int | None = None):
    """An event file named ``name`` in ``folder`` holding ``scalars`` ((tag, step, value)), after a restart
    marker at ``restart_at`` (what a resumed run writes first)."""
    scratch = folder / f"scratch-{name}"
    writer = SummaryWriter(str(scratch))
    if restart_at is not None:
        writer.file_writer.add_event(Event(step=restart_at, session_log=SessionLog(status=SessionLog.START)))
    for tag, step, value in scalars:
        writer.add_scalar(tag, value, step)
    writer.close()
    (written,) = scratch.iterdir()
    written.rename(folder / name)
    scratch.rmdir()


def test_event_files_sort_by_the_second_then_the_writer_count_as_a_number():
    names = [
        "events.out.tfevents.1796177894.host.a.7.10",
        "events.out.tfevents.1796177894.host.a.7.9",
        "events.out.tfevents.1796177892.host.a.7.11",
    ]
    assert sorted(names, key=creation_order) == [names[2], names[1], names[0]]


def test_a_resumed_run_keeps_its_values_when_its_files_names_sort_out_of_order(tmp_path):
    # A run stopped after step 6, resumed at step 5 in the same process; in the same second the resumed
    # run's fit file got writer count 9 and its test file 10, which sorts first as text.
    stem = "events.out.tfevents.{}.host.4242.{}"
    _event_file(tmp_path, stem.format(1796177892, 8), [("train/mse", s, 1.0) for s in range(7)])
    _event_file(tmp_path, stem.format(1796177894, 9), [("train/mse", s, 2.0) for s in range(5, 10)], restart_at=5)
    _event_file(tmp_path, stem.format(1796177894, 10), [("test/mse", 10, 3.0)])
    scalars = read_scalars(tmp_path)
    assert scalars["test/mse"] == [(10, 3.0)]
    assert scalars["train/mse"] == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 10)]
