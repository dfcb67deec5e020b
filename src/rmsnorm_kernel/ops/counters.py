"""How many times the Triton forward and backward ran: off by default, on inside ``counting()``.

While counting is on, every call of the Triton path that launches kernels also calls the op
``rmsnorm_kernel::count_call(counts, direction)``, which adds 1 to ``counts[direction]`` (0: forward, 1:
backward) and declares that write in its schema (``Tensor(a!)``). So the count is a graph operation like
any other: eager code runs it per call; ``torch.compile`` puts it into the graph beside the kernels it
counts, forward and backward, and so a compiled step counts once per run of the graph. The kernels
themselves write nothing but their outputs, and with counting off (the default) no count op runs at all.

The counts live in one (2,) int64 tensor per device, made when counting first meets that device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

FORWARD, BACKWARD = 0, 1

# device (as a string) -> its (2,) int64 counts
_COUNTS: dict[str, Tensor] = {}
_enabled = False


@torch.library.custom_op("rmsnorm_kernel::count_call", mutates_args=("counts",))
def count_call(counts: Tensor, direction: int) -> None:
    """Add 1 to ``counts[direction]``: a Triton call in that direction ran (0: forward, 1: backward)."""
    if direction not in (FORWARD, BACKWARD):
        raise ValueError(f"count_call: direction {direction!r} is not a direction; accepted: 0 or 1")
    counts[direction] += 1


@count_call.register_fake
def _count_call_fake(counts: Tensor, direction: int) -> None:
    return None


@contextmanager
def counting() -> Iterator[None]:
    """Count the Triton path's calls inside this block (``call_counts()`` reads them). Nested blocks
    keep counting until the outermost one ends. A graph compiled inside the block counts whenever it
    runs, and one compiled outside it never does: ``torch.compile`` recompiles when the setting changes."""
    global _enabled
    before = _enabled
    _enabled = True
    try:
        yield
    finally:
        _enabled = before


@torch.compiler.assume_constant_result
def _allocate(device: str) -> bool:
    """Make ``device``'s counts if they do not exist yet. While torch.compile traces a call, this runs as
    plain Python (``assume_constant_result``), so the counts are a real tensor, made once, that the graph
    takes as an input."""
    if device not in _COUNTS:
        _COUNTS[device] = torch.zeros(2, dtype=torch.int64, device=device)
    return True


def counts_for(device: torch.device) -> Tensor | None:
    """The counts of ``device`` while counting is on, else None (nothing to count into)."""
    if not _enabled:
        return None
    key = str(device)
    _allocate(key)
    return _COUNTS[key]


def call_counts() -> dict[str, int]:
    """How many times the Triton forward and backward ran while counting was on, since import or
    ``reset_call_counts()``, summed over devices: ``{"forward": ..., "backward": ...}``. A compiled
    graph, or a CUDA graph replayed, counts once per run. Reading waits for the device.

    A call whose x has no rows (shape (0, N), (2, 0, N), ...) launches no kernel and is not counted."""
    forward = backward = 0
    for counts in _COUNTS.values():
        f, b = counts.tolist()
        forward, backward = forward + f, backward + b
    return {"forward": forward, "backward": backward}


def reset_call_counts() -> None:
    for counts in _COUNTS.values():
        counts.zero_()
