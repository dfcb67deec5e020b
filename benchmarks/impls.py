"""The implementations under test, and one whole call of each: what every measurement here runs.

The Triton path (``rmsnorm``) and its peers, by the names of ``IMPLS``: the eager reference,
``torch.nn.functional.rms_norm``, ``torch.compile`` of the reference (compiled afresh each time
``make_impl`` is asked, with ``dynamic=False`` after ``torch.compiler.reset()``, so that no recompile limit
ever sends it back to eager code), Liger-Kernel's ``LigerRMSNormFunction`` with its own defaults
(``LIGER_SETTINGS``) when it can be imported, and ``seed``: the one-program-per-row kernel a newcomer
writes first (``seed_kernel.py``). ``make_call`` makes one whole call of an implementation in
one direction (``MODES``); ``parse_impls`` reads an ``--impls`` option; ``versions`` names the software
measured.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import torch

from rmsnorm_kernel.ops.op import rmsnorm
from rmsnorm_kernel.ops.reference import DEFAULT_EPS, rmsnorm_reference

from .common import comma_choices
from .seed_kernel import seed_rmsnorm

EPS = DEFAULT_EPS
FWD, FWD_BWD = "fwd", "fwd+bwd"
MODES = (FWD, FWD_BWD)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

IMPLS = ("triton", "reference", "F.rms_norm", "compile", "liger", "seed")
#: The implementations that run only on a CUDA GPU: a run without one leaves them out.
GPU_ONLY = ("compile", "liger")
#: Liger-Kernel's own defaults, used as they are: the comparison is against what users already have.
LIGER_SETTINGS = {"offset": 0.0, "casting_mode": "llama", "in_place": True}

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _liger_fn() -> ForwardFn | None:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # not installed, or it fails to import on this machine
        return None
    s = LIGER_SETTINGS
    # apply(X, W, eps, offset, casting_mode, in_place): positional, as autograd.Function.apply takes them.
    return lambda x, g: LigerRMSNormFunction.apply(x, g, EPS, s["offset"], s["casting_mode"], s["in_place"])


def without_gpu(impls: list[str]) -> list[str]:
    """``impls`` less those of ``GPU_ONLY``; ValueError with a one-line reason when that leaves none."""
    left = [i for i in impls if i not in GPU_ONLY]
    if not left:
        runnable = ",".join(i for i in IMPLS if i not in GPU_ONLY)
        raise ValueError(
            f"--impls {','.join(impls)}: none of them runs without a CUDA GPU; accepted here: a subset of {runnable}"
        )
    return left


def liger_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:
        return None


def versions() -> dict:
    import triton

    return dict(
        torch=torch.__version__,
        triton=triton.__version__,
        liger_kernel=liger_version(),
        python=platform.python_version(),
    )


def make_impl(name: str, device: str) -> ForwardFn | None:
    """The forward function of implementation ``name`` (None: not available here). ``compile`` must be
    made again for each shape (``benchmark.run_benchmark`` does)."""
    if name == "triton":
        return lambda x, g: rmsnorm(x, g, EPS)
    if name == "reference":
        return lambda x, g: rmsnorm_reference(x, g, EPS)
    if name == "F.rms_norm":
        return lambda x, g: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, EPS)
    if name == "compile":
        torch.compiler.reset()  # a fresh cache for this shape: no recompile limit, no stale guards
        return torch.compile(lambda x, g: rmsnorm_reference(x, g, EPS), dynamic=False)
    if name == "liger":
        return _liger_fn() if device == "cuda" else None
    if name == "seed":
        return lambda x, g: seed_rmsnorm(x, g, EPS)
    raise ValueError(f"benchmark: impl is {name!r}; accepted: {', '.join(IMPLS)}")


#: ``--impls``: comma-separated names of ``IMPLS``, at least one (an argparse ``type``).
parse_impls = comma_choices("implementation", IMPLS)


def make_call(mode: str, fn: ForwardFn, x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor) -> Callable[[], tuple]:
    """One whole call: forward alone on inputs that need no gradient, or forward + autograd backward.

    ``torch.autograd.grad`` returns dx and dgamma without accumulating into ``.grad`` (no extra kernel).
    """
    if mode == FWD:
        x0, g0 = x.detach(), gamma.detach()
        return lambda: (fn(x0, g0),)
    xl, gl = x.detach().requires_grad_(), gamma.detach().requires_grad_()

    def step():
        y = fn(xl, gl)
        dx, dgamma = torch.autograd.grad(y, (xl, gl), dy)
        return y, dx, dgamma

    return step
