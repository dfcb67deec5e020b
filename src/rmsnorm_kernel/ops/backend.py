"""Which machine runs the Triton kernels: the GPU, or Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when it decorates a kernel, so the choice is made here, before Triton
is imported: ``rmsnorm_kernel/__init__.py`` imports this module first, and it imports torch only.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger("rmsnorm_kernel")

CUDA = "cuda"
INTERPRETER = "interpreter"


def _choose_backend() -> str:
    if os.environ.get("TRITON_INTERPRET") == "1":
        log.info(
            "rmsnorm_kernel: TRITON_INTERPRET=1 is set; the Triton kernels run on the CPU through Triton's interpreter"
        )
        return INTERPRETER
    if torch.cuda.is_available():
        return CUDA
    os.environ["TRITON_INTERPRET"] = "1"
    log.warning(
        "rmsnorm_kernel: no CUDA device found; the Triton kernels run on the CPU through Triton's "
        "interpreter (TRITON_INTERPRET=1), which is correct but slow"
    )
    return INTERPRETER


_BACKEND = _choose_backend()


def backend() -> str:
    """``"cuda"`` when the kernels are compiled for the GPU, ``"interpreter"`` when they run on the CPU."""
    return _BACKEND


def kernel_device_type() -> str:
    """The device type of the tensors the kernels accept under the current backend."""
    return "cuda" if _BACKEND == CUDA else "cpu"
