"""RMSNorm in Triton, checked against a PyTorch oracle.

The public API is below. It is imported on first use, so that importing a part that needs no kernel
(the training configuration, say) does not import Triton.

``ops.backend`` is imported first, before any module of the package can import Triton: it sets
TRITON_INTERPRET on machines without a CUDA device, and Triton reads that variable when it decorates a
kernel (its own ``tl`` helpers included, at ``import triton``). Where Triton was imported earlier (by
``transformers``, say), ``ops.backend`` has Triton's helpers decorated again for the interpreter, so the
order of imports does not matter.

Before that, ``signals.guard_if_command`` gives a ``python -m`` command one line for Ctrl+C while it
starts.
"""

from .signals import guard_if_command as _guard_if_command

_guard_if_command()

import importlib  # noqa: E402

from .ops import backend as _backend  # noqa: E402, F401  (first of the package's modules: see above)

_API = {
    "ContractError": "ops.contract",
    "RMSNorm": "ops.module",
    "backend": "ops.backend",
    "call_counts": "ops.counters",
    "counting": "ops.counters",
    "manual_backward": "ops.reference",
    "oracle": "ops.reference",
    "reset_call_counts": "ops.counters",
    "rmsnorm": "ops.op",
    "rmsnorm_reference": "ops.reference",
    "swap_rmsnorm": "ops.swap",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'rmsnorm_kernel' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
