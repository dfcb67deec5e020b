"""TensorBoard event files: writing raw events into a run's folder (hparams, the restart marker, the
custom-scalars layout), and reading them back (the training summary and the figures)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..ops.impls import IMPLS

if TYPE_CHECKING:
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.tensorboard import FileWriter


@contextlib.contextmanager
def run_event_writer(logger: TensorBoardLogger) -> Iterator[FileWriter]:
    """The ``FileWriter`` of the logger's run folder, for events and summaries that ``SummaryWriter``
    has no method for; flushed on exit.

    That is the ``SummaryWriter``'s own ``file_writer`` (its event file). Lightning closes the
    ``SummaryWriter`` when fit and test end, which drops it; then a new ``FileWriter`` opens a new event
    file in the same folder (as the ``SummaryWriter`` does when it next writes) and is closed on exit.
    """
    summary_writer = logger.experiment
    writer = summary_writer.file_writer
    opened = writer is None
    if opened:
        from torch.utils.tensorboard import FileWriter

        writer = FileWriter(summary_writer.get_logdir())
    try:
        yield writer
    finally:
        if opened:
            writer.close()
        else:
            writer.flush()


#: The optional path prefix of a parity tag (``callbacks.parity_name``): ``parity/native_output_err``.
_PATH = f"(?:(?:{'|'.join(IMPLS)})_)?"


#: The charts of every run's page, after its losses (``layout``).
CHARTS = {
    "parity: largest |difference| of outputs and gradients from the reference": [
        "Multiline",
        [rf"^parity/{_PATH}output_err$", rf"^parity/{_PATH}grad_err$"],
    ],
    "parity: worst difference / tolerance (passes at 1 or less)": [
        "Multiline",
        [rf"^parity/{_PATH}worst_over_tol$"],
    ],
    "time/step_ms and time/rmsnorm_ms (medians of each logging window)": [
        "Multiline",
        [r"^time/step_ms$", r"^time/rmsnorm_ms$"],
    ],
}


def layout(loss_name: str) -> dict:
    """TensorBoard's CUSTOM SCALARS page: the comparison of the paths on one page. Each chart draws the
    tags its regular expressions match, for every run shown, so ``tensorboard --logdir runs`` puts the
    reference, native and Triton runs side by side in each chart; the parity charts draw each compared
    path's numbers (``parity/output_err`` of Triton, ``parity/native_output_err``...). ``loss_name``: the
    network's (``network.LOSS_NAMES``); the language model's runs also chart their validation perplexity."""
    losses = {f"{split}/{loss_name}": ["Multiline", [rf"^{split}/{loss_name}$"]] for split in ("train", "val")}
    if loss_name == "loss":
        losses["val/ppl"] = ["Multiline", [r"^val/ppl$"]]
        losses["time/tokens_per_s (every process's tokens at each window's median step)"] = [
            "Multiline",
            [r"^time/tokens_per_s$"],
        ]
    return {"rmsnorm_kernel: the RMSNorm paths side by side": {**losses, **CHARTS}}


def write_layout(logger: TensorBoardLogger, loss_name: str) -> None:
    """``layout(loss_name)`` into the logger's run folder (each run carries it: TensorBoard shows it once)."""
    from torch.utils.tensorboard.summary import custom_scalars

    with run_event_writer(logger) as writer:
        writer.add_summary(custom_scalars(layout(loss_name)))


#: TensorBoard's event file name: ``events.out.tfevents.<seconds>.<host>.<pid>.<n>``, then any suffix.
EVENT_FILE = re.compile(r"events\.out\.tfevents\.(?P<seconds>\d+)\..+\.\d+\.(?P<n>\d+)")


def creation_order(name: str) -> tuple[int, int, str]:
    """The sort key of an event file by its name: the second it was opened, then the process's count of
    writers (``n``) as a number. TensorBoard sorts the names as text, where a run's ``.10`` comes before
    its ``.9`` opened in the same second."""
    m = EVENT_FILE.match(name)
    return (int(m["seconds"]), int(m["n"]), name) if m else (0, 0, name)


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard run directory: tag -> [(step, value), ...] in step order.

    TensorBoard's ``EventAccumulator`` purges orphaned data (its default): when a resumed run's events
    restart at an earlier step, the interrupted process's values from that step on are dropped, so each
    step keeps one value. That needs the files read in the order they were written (``creation_order``):
    the accumulator reads links to them, named in that order.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # one INFO line per event file otherwise
    files = sorted((f for f in Path(log_dir).iterdir() if "tfevents" in f.name), key=lambda f: creation_order(f.name))
    with tempfile.TemporaryDirectory() as ordered:
        for i, f in enumerate(files):
            os.symlink(f.resolve(), Path(ordered) / f"events.out.tfevents.{i:08d}")
        acc = EventAccumulator(ordered, size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
