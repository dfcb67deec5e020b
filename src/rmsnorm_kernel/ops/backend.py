"""Which machine runs the Triton kernels: the GPU, or Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function: with it set, the decorator
returns an ``InterpretedFunction``, which runs on the CPU; without it, a ``JITFunction``, which compiles
for a GPU and cannot be called from an interpreted kernel ("Cannot call @triton.jit'd outside of the
scope of a kernel"). That holds for Triton's own helpers in ``triton.language`` too (``tl.sum``,
``tl.cdiv``, ``tl.zeros``, ...: ``@triton.jit`` functions of ``triton.language.standard`` and
``triton.language.random``), which are decorated at ``import triton``.

So the choice is made here, before this package imports Triton: ``rmsnorm_kernel/__init__.py`` imports
this module first, and it imports torch only (Triton's modules only where Triton is imported already).
The package's kernels are decorated after it, when ``kernels.py`` is imported. Triton may have been
imported before, though (by ``transformers``, by ``torch.compile``, or directly): then its helpers are
already compiled-mode functions. Under the interpreter, this module then runs Triton's modules that
define them again (``importlib.reload``), so that ``@triton.jit`` decorates them anew for the
interpreter, as it would have with the variable set from the start; where that leaves any
compiled-mode helper, it refuses at import with what to do.

Under the interpreter it also refuses at import a Triton and a NumPy that cannot run it together:
Triton 3.6's interpreter converts one-element arrays to Python ints with ``int()``, which NumPy 2.4
refuses ("only 0-dimensional arrays can be converted to Python scalars"), so every kernel would fail;
Triton 3.7 converts them first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import re
import sys

import torch

log = logging.getLogger("rmsnorm_kernel")

CUDA = "cuda"
INTERPRETER = "interpreter"

_REFUSAL = (
    "rmsnorm_kernel: Triton's @triton.jit helpers (tl.sum, tl.cdiv, ...) are compiled for a GPU, and the "
    "interpreter cannot call them; set TRITON_INTERPRET=1 in the environment before starting Python, and "
    "leave triton.knobs.runtime.interpret unset"
)


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


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``3.6.0`` or ``2.4.0rc1``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def interpreter_problem(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton's interpreter of ``triton_version`` cannot run the kernels with NumPy of
    ``numpy_version``, in one line with what is accepted; None when it can."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (
            f"rmsnorm_kernel: without a GPU the kernels run in Triton's interpreter, and Triton "
            f"{triton_version}'s interpreter fails with NumPy {numpy_version} (it converts arrays to Python "
            "ints in a way NumPy 2.4 refuses); accepted: numpy < 2.4 (pip install 'numpy<2.4') or triton >= 3.7"
        )
    return None


def _check_interpreter_versions() -> None:
    problem = interpreter_problem(importlib.metadata.version("triton"), importlib.metadata.version("numpy"))
    if problem is not None:
        raise ImportError(problem)


def _compiled_helpers(tl) -> list:
    """Triton's helpers that ``@triton.jit`` decorated for a GPU (``JITFunction``s): those ``triton.language``
    exports, and those it attaches to its tensor class (``x.sum()``)."""
    from triton.runtime import JITFunction

    candidates = [*vars(tl).values(), *(getattr(tl.tensor, name) for name in dir(tl.tensor))]
    return [value for value in candidates if isinstance(value, JITFunction)]


def _interpret_triton_helpers() -> None:
    """Under the interpreter, if Triton was imported before TRITON_INTERPRET=1 was set, decorate its
    ``@triton.jit`` helpers again, now for the interpreter; refuse at import where that does not succeed."""
    tl = sys.modules.get("triton.language")
    if tl is None:
        return  # Triton is not imported yet: it will read the variable when it is
    stale = _compiled_helpers(tl)
    if not stale:
        return
    modules = sorted({helper.fn.__module__ for helper in stale})  # triton.language.standard, .random
    try:
        for name in modules:
            importlib.reload(sys.modules[name])
        importlib.reload(tl)  # the package re-exports the helpers under their public names
    except Exception as e:
        raise ImportError(_REFUSAL) from e
    if _compiled_helpers(tl):  # the decorator did not see the variable: triton.knobs.runtime.interpret is False
        raise ImportError(_REFUSAL)
    log.info(
        "rmsnorm_kernel: Triton was imported before TRITON_INTERPRET=1 was set; %s were run again so that "
        "its @triton.jit helpers (tl.sum, tl.cdiv, ...) run in the interpreter",
        ", ".join(modules),
    )


_BACKEND = _choose_backend()
if _BACKEND == INTERPRETER:
    _check_interpreter_versions()
    _interpret_triton_helpers()


def backend() -> str:
    """``"cuda"`` when the kernels are compiled for the GPU, ``"interpreter"`` when they run on the CPU."""
    return _BACKEND


def kernel_device_type() -> str:
    """The device type of the tensors the kernels accept under the current backend."""
    return "cuda" if _BACKEND == CUDA else "cpu"
