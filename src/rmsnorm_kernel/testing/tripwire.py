"""The tripwire: proof that no Triton kernel launches while it is set.

``kernel_launches_forbidden()`` replaces every Triton kernel of ``ops/kernels.py`` by an object that
raises ``KernelLaunched`` on any use. The launchers look their kernels up in the module when they run,
so they meet the tripwires; the planning helpers stay, since the contract may consult them.
"""

from __future__ import annotations

import contextlib

from ..ops import kernels


class KernelLaunched(AssertionError):
    """A Triton kernel of ``ops/kernels.py`` was launched while launches were forbidden."""


class _Tripwire:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):  # a Triton kernel is launched as kernel[grid](...)
        raise KernelLaunched(f"kernels.{self.name} was launched")

    def __call__(self, *args, **kwargs):
        raise KernelLaunched(f"kernels.{self.name} was called")

    def __getattr__(self, attr):  # .run(...), .warmup(...), or anything else reaching for the kernel
        raise KernelLaunched(f"kernels.{self.name}.{attr} was used")


def triton_kernels() -> dict[str, object]:
    """The Triton kernels of ``ops/kernels.py`` by name: every ``triton.jit`` object of the module
    (compiled, or interpreted where there is no GPU)."""
    import triton

    return {name: obj for name, obj in vars(kernels).items() if isinstance(obj, triton.KernelInterface)}


@contextlib.contextmanager
def kernel_launches_forbidden():
    """Every Triton kernel of ``ops/kernels.py`` is a tripwire inside the block; yields the names replaced.
    The real kernels are back after it, whatever happened inside."""
    saved = triton_kernels()
    try:
        for name in saved:
            setattr(kernels, name, _Tripwire(name))
        yield sorted(saved)
    finally:
        for name, obj in saved.items():
            setattr(kernels, name, obj)
