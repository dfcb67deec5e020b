"""How many times the Triton forward and backward ran, counted by the kernels themselves on the device.

Each device has two int64 counts, forward and backward, and a tensor ``calls(device)`` that holds their
two addresses. The launchers pass that tensor to the kernels; program 0 of the forward kernel (of the
first backward kernel) reads the first (second) address from it and adds 1 there. So a call counts
also where no Python of this package runs: a CUDA graph's replay, or the code ``torch.compile``
generated around the kernels.

Why through addresses: under ``torch.compile`` the kernels are part of the graph, and Inductor sees
what each one writes. A counter it saw written, it would functionalize (count into a copy), and a
counter the op body found by itself would become a constant of the graph, stored in Inductor's cache
and so reused by the next process. ``calls(device)`` is instead an input of the op that the kernels only
read: the compiled code takes it from the caller on every call, and a CUDA graph that copies it copies
the same two addresses.
"""

from __future__ import annotations

import torch

# device (as a string) -> (the counts, the tensor of their addresses)
_COUNTERS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


@torch.compiler.assume_constant_result
def _allocate(device: str) -> bool:
    """Make ``device``'s counters if they do not exist yet. While torch.compile traces a call, this runs
    as plain Python (``assume_constant_result``), so the counters are real tensors, made once."""
    if device not in _COUNTERS:
        counts = torch.zeros(2, dtype=torch.int64, device=device)
        _COUNTERS[device] = (counts, addresses(counts))
    return True


def addresses(counts: torch.Tensor) -> torch.Tensor:
    """The ``calls`` tensor of ``counts``, a (2,) int64 tensor of a forward and a backward count: their
    two addresses, on their device. The caller keeps ``counts`` alive while kernels may count into it."""
    return torch.tensor([counts.data_ptr(), counts.data_ptr() + counts.element_size()], device=counts.device)


def calls(device: torch.device) -> torch.Tensor:
    """The int64 tensor of the addresses of ``device``'s forward and backward counts: the ``calls``
    argument of the launchers and of the ops."""
    key = str(device)
    _allocate(key)
    return _COUNTERS[key][1]


def call_counts() -> dict[str, int]:
    """How many times the Triton forward and backward ran since import or ``reset_call_counts()``,
    summed over devices: ``{"forward": ..., "backward": ...}``. Counted by the kernels on the device, so
    a call replayed from a CUDA graph counts once per replay. Reading waits for the device.

    A call whose x has no rows (shape (0, N), (2, 0, N), ...) launches no kernel and so is not counted:
    it returns an empty y, and its backward an empty dx and a dgamma of zeros, without running anything.
    The counts are those of the calls that computed something."""
    forward = backward = 0
    for counts, _ in _COUNTERS.values():
        f, b = counts.tolist()
        forward, backward = forward + f, backward + b
    return {"forward": forward, "backward": backward}


def reset_call_counts() -> None:
    for counts, _ in _COUNTERS.values():
        counts.zero_()
