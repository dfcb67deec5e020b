"""The Triton path's autograd node in C++ (``native.cpp``), for the GPU.

On the GPU, ``rmsnorm()`` takes this route when it can. The Python route (``op._RMSNormFunction``)
costs a Python ``autograd.Function`` plus Python launchers on every call, and at small shapes that host
time is more than all of ``F.rms_norm``'s forward + backward (docs/performance-notes.md, "The host
floor"). The C++ route makes the same launches with none of that Python.

How it works:

- Recording. The first call for a key (device, dtypes of x and gamma, rows, N) runs the Python launchers
  once inside ``kernels.recording()``. They use the same plan and the same compiled kernels as always.
  The recorded launches become a recipe: per launch, Triton's compiled kernel handle, grid, warps and
  shared memory, and each argument as a tensor slot, the call's eps, or a fixed integer. The extension
  stores the recipe.
- Replay. Later calls with that key replay the recipe from C++, through
  ``torch::autograd::Function``. Those calls are bit-identical to the Python route, because the kernels
  and plans are the same. The tests check this.

Only contiguous, 16-byte-aligned x and gamma take this route, because the recipe fixes the row strides
and the pointer alignment that Triton specialized on. Everything else takes the Python route, as do
``torch.compile`` tracing, tensor subclasses and the CPU interpreter.

The extension is compiled with ``torch.utils.cpp_extension`` at the first call on a GPU. That needs a C++
compiler and the CUDA headers, takes about 35 s (on the H200 machine's host), and is cached per torch
version. If it cannot be built, the Python route runs and a warning says why. Set
``RMSNORM_KERNEL_NATIVE=0`` to always take the Python route.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import kernels
from .backend import CUDA, backend, log
from .contract import ContractError, check_backward_scratch

#: RMSNORM_KERNEL_NATIVE=0 turns the C++ route off (the Python route runs every call).
ENABLED = os.environ.get("RMSNORM_KERNEL_NATIVE", "1") != "0"

# The argument kinds of native.cpp's recipes.
_TENSOR, _I32, _I64, _EPS = 0, 1, 2, 3

_extension = None
_built = False  # the build was attempted (successfully or not)
_unsupported: set[tuple] = set()  # keys whose launches cannot be replayed from C++


def extension():
    """The compiled extension, built on first use; None off the GPU, when disabled, or when the build
    fails (with a warning naming the reason)."""
    global _extension, _built
    if _built:
        return _extension
    _built = True
    if not (ENABLED and backend() == CUDA and kernels.FAST_LAUNCH and torch.version.cuda):
        return None
    try:
        from torch.utils.cpp_extension import load

        log.info("rmsnorm_kernel: building the C++ autograd route (once per torch version, then cached)")
        _extension = load(
            name="rmsnorm_kernel_native",
            sources=[str(Path(__file__).with_name("native.cpp"))],
            extra_cflags=["-O2"],
            extra_ldflags=["-ldl"],
            with_cuda=True,
            verbose=False,
        )
    except Exception as error:  # no compiler, no CUDA headers, ...: the Python route still works
        last_line = (str(error).strip().splitlines() or [""])[-1]
        log.warning("rmsnorm_kernel: the C++ autograd route could not be built (%s: %s); every call takes the "
                    "Python route", type(error).__name__, last_line)
        _extension = None
    return _extension


def apply(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``rmsnorm(x, gamma, eps)`` through the C++ route, differentiable when a gradient is needed; None
    when that route cannot take these arguments (the caller then takes the Python route).

    Assumes arguments that passed ``contract.check_forward`` (and ``check_backward_scratch`` when a
    gradient is needed)."""
    ext = _extension if _built else extension()
    if ext is None:
        return None
    y = ext.apply(x, gamma, eps)
    if y is None and _record(ext, x, gamma, eps):
        y = ext.apply(x, gamma, eps)
    return y


def call_counts() -> tuple[int, int]:
    """(forward, backward) calls made through the C++ route."""
    return tuple(_extension.call_counts()) if _extension is not None else (0, 0)


def reset_call_counts() -> None:
    if _extension is not None:
        _extension.reset_call_counts()


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _record(ext, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> bool:
    """Record the launches for x's key and store them in the extension; False when this key cannot take
    the C++ route (its layout, or a launch the recipe format cannot express)."""
    if not (x.is_cuda and x.is_contiguous() and gamma.is_contiguous() and _aligned(x) and _aligned(gamma)):
        return False
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    key = (x.device, x.dtype, gamma.dtype, rows, n)
    if rows == 0 or key in _unsupported:
        return False
    try:
        # Recording runs the backward once too (on a zero dy), so only a key whose backward the
        # contract accepts is recorded; a forward-only call of any other key takes the Python route.
        # The scratch bound depends on the key alone, so the refusal is remembered like the others.
        check_backward_scratch(x)
    except ContractError:
        _unsupported.add(key)
        return False
    with torch.no_grad(), torch.cuda.device(x.device):  # Triton loads the kernels for the current device
        xs, gs = x.detach(), gamma.detach()
        with kernels.recording() as forward:
            y = kernels.rmsnorm_forward(xs, gs, eps)
        dy = torch.zeros_like(y)
        with kernels.recording() as backward:
            dx, dgamma = kernels.rmsnorm_backward(dy, xs, gs, eps)
    scratch: list[torch.Tensor] = []
    forward_specs = _specs(forward, [xs, gs, y], None, eps)
    backward_specs = _specs(backward, [dy, xs, gs, dx, dgamma], scratch, eps)
    ok = (forward_specs is not None and backward_specs is not None
          and ext.add_recipe(x, gamma, forward_specs, backward_specs, scratch))
    if not ok:
        _unsupported.add(key)
        log.info("rmsnorm_kernel: %s takes the Python route (its launches cannot be replayed from C++)", key)
    return ok


def _specs(launches: list, slots: list[torch.Tensor], scratch: list[torch.Tensor] | None, eps: float):
    """native.cpp's description of the recorded launches, or None if one cannot be expressed. Tensors
    that are not among ``slots`` are the launcher's own scratch: they are appended to ``scratch`` (their
    shape and dtype are allocated again at each call) and numbered after the slots."""
    if not launches:
        return None
    specs = []
    for launched in launches:
        compiled = launched.compiled
        meta = compiled.metadata
        if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False)
                or getattr(meta, "launch_pdl", False) or getattr(meta, "global_scratch_size", 0)
                or getattr(meta, "profile_scratch_size", 0)):
            return None
        try:
            names = compiled.src.fn.arg_names
            types = compiled.src.signature
        except AttributeError:
            return None
        args = []
        for name, value in zip(names, launched.args, strict=True):
            ty = types.get(name, "constexpr")
            if ty == "constexpr":  # declared tl.constexpr, or an integer Triton specialized (== 1)
                continue
            if ty.startswith("*"):
                slot = _slot(value, slots, scratch)
                if slot is None:
                    return None
                args.append((_TENSOR, slot))
            elif ty in ("i32", "i64"):
                args.append((_I32 if ty == "i32" else _I64, int(value)))
            elif ty == "fp32" and value == eps:
                args.append((_EPS, 0))
            else:
                return None
        grid = launched.grid
        specs.append((compiled.function, grid[0], grid[1] if len(grid) > 1 else 1, 32 * meta.num_warps,
                      meta.shared, args))
    return specs


def _slot(t: torch.Tensor, slots: list[torch.Tensor], scratch: list[torch.Tensor] | None) -> int | None:
    for i, s in enumerate(slots):
        if t.data_ptr() == s.data_ptr():
            return i
    if scratch is None:
        return None
    for i, s in enumerate(scratch):
        if t.data_ptr() == s.data_ptr():
            return len(slots) + i
    if not t.is_contiguous():
        return None
    scratch.append(t)
    return len(slots) + len(scratch) - 1
