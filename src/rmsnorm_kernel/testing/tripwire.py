"""The tripwire: proof that no Triton kernel launches while it is set.

``kernel_launches_forbidden()`` replaces every Triton kernel of ``ops/kernels.py`` and
``ops/looped_kernels.py`` by an object that raises ``KernelLaunched`` on any use. The launchers look their
kernels up in the modules when they run, so they meet the tripwires; the planning helpers stay, since the
contract may consult them.
"""

from __future__ import annotations

import contextlib

from ..ops import kernels, looped_kernels

#: The modules that hold the kernels.
MODULES = (kernels, looped_kernels)


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


def _defined() -> list[tuple[object, str, object]]:
    """(module, name, kernel) for every ``triton.jit`` object defined in one of ``MODULES`` (compiled, or
    interpreted where there is no GPU); a helper that a module imports belongs to the module defining it."""
    import triton

    return [
        (module, name, obj)
        for module in MODULES
        for name, obj in vars(module).items()
        if isinstance(obj, triton.KernelInterface) and obj.fn.__module__ == module.__name__
    ]


def triton_kernels() -> dict[str, object]:
    """The Triton kernels of ``MODULES`` by name."""
    return {name: obj for _, name, obj in _defined()}


@contextlib.contextmanager
def kernel_launches_forbidden():
    """Every Triton kernel of ``MODULES`` is a tripwire inside the block; yields the names replaced. The
    real kernels are back after it, whatever happened inside."""
    saved = _defined()
    try:
        for module, name, _ in saved:
            setattr(module, name, _Tripwire(name))
        yield sorted(name for _, name, _ in saved)
    finally:
        for module, name, obj in saved:
            setattr(module, name, obj)
