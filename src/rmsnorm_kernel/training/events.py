"""Reading TensorBoard event files back: the training summary and the figures both use this."""

from __future__ import annotations

import logging
from pathlib import Path


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard run directory: tag -> [(step, value), ...] in step order.

    TensorBoard's ``EventAccumulator`` purges orphaned data (its default): when a resumed run's events
    restart at an earlier step, the interrupted process's values from that step on are dropped, so each
    step keeps one value.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # one INFO line per event file otherwise
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
