"""RMSNorm in Triton, checked against a PyTorch oracle.

``backend`` is imported first: it sets TRITON_INTERPRET on machines without a CUDA device, and Triton
reads that variable when the kernels are decorated.
"""

from .backend import backend  # noqa: I001  (must precede the kernels)
from .contract import ContractError
from .module import RMSNorm
from .op import call_counts, reset_call_counts, rmsnorm
from .reference import manual_backward, rmsnorm_reference

__all__ = [
    "ContractError",
    "RMSNorm",
    "backend",
    "call_counts",
    "manual_backward",
    "reset_call_counts",
    "rmsnorm",
    "rmsnorm_reference",
]
