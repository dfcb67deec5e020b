"""What the tests and the check commands share, defined once: they import it from here.

- ``inputs``: ``make_inputs``, the one generator of x, gamma and dy;
- ``bad_inputs``: ``CONTRACT_VIOLATIONS``, the named inputs the Triton path must refuse, each with the
  argument at fault and the message its ``ContractError`` must carry;
- ``tripwire``: ``kernel_launches_forbidden``, which replaces every Triton kernel of ``ops/kernels.py``
  by one that raises ``KernelLaunched``, to prove that nothing launched;
- ``mutants``: deliberately broken kernels made from the real ones (every mean over BLOCK_N instead of
  N), which the checks must catch.

Names are imported on first use, so that drawing inputs does not import Triton.
"""

import importlib

_API = {
    "make_inputs": "inputs",
    "CONTRACT_VIOLATIONS": "bad_inputs",
    "Violation": "bad_inputs",
    "KernelLaunched": "tripwire",
    "kernel_launches_forbidden": "tripwire",
    "triton_kernels": "tripwire",
    "block_mean_kernel": "mutants",
    "block_mean_source": "mutants",
    "dx_block_mean": "mutants",
    "forward_block_mean": "mutants",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'rmsnorm_kernel.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
