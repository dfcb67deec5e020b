"""The ``reference`` command: the oracle's own gradients, checked before anything is checked against it.

A float64 ``torch.autograd.gradcheck`` of ``rmsnorm_reference`` (autograd's Jacobian against finite
differences), and the hand-written ``manual_backward`` against autograd through ``rmsnorm_reference`` in
float64 and in every dtype the kernels accept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..ops.reference import DEFAULT_EPS, manual_backward, rmsnorm_reference
from ..ops.tolerances import compare
from ..testing import make_inputs
from .campaigns import DTYPES
from .report import dtype_name, one_line

REFERENCE_SHAPES = ((1, 1), (3, 7), (2, 3, 5), (4, 257))


@dataclass
class ReferenceCheck:
    check: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""


def _autograd(x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, eps: float):
    xl = x.detach().clone().requires_grad_()
    gl = gamma.detach().clone().requires_grad_()
    rmsnorm_reference(xl, gl, eps).backward(dy)
    return xl.grad, gl.grad


def reference_checks(shapes: Iterable[Sequence[int]] | None = None) -> list[ReferenceCheck]:
    """float64 gradcheck of the oracle, and its hand-written backward against autograd in every dtype,
    for each of ``shapes`` (default ``REFERENCE_SHAPES``)."""
    results = []
    for i, shape in enumerate(map(tuple, REFERENCE_SHAPES if shapes is None else shapes)):
        x, gamma, _ = make_inputs(shape, torch.float64, "cpu", seed=1000 + i)
        try:
            ok = torch.autograd.gradcheck(
                lambda a, b: rmsnorm_reference(a, b), (x.requires_grad_(), gamma.requires_grad_()), raise_exception=True
            )
            results.append(ReferenceCheck("gradcheck", "float64", shape, math.nan, math.nan, bool(ok)))
        except Exception as exc:  # gradcheck raises GradcheckError with the mismatching Jacobians
            results.append(ReferenceCheck("gradcheck", "float64", shape, math.nan, math.nan, False, one_line(exc)))
        for dtype in (torch.float64, *DTYPES):
            x, gamma, dy = make_inputs(shape, dtype, "cpu", seed=2000 + i)
            dx_auto, dgamma_auto = _autograd(x, gamma, dy, DEFAULT_EPS)
            dx_man, dgamma_man = manual_backward(x, gamma, dy, DEFAULT_EPS)
            for name, got, want in (
                ("manual dx = autograd", dx_man, dx_auto),
                ("manual dgamma = autograd", dgamma_man, dgamma_auto),
            ):
                c = compare(got, want)
                results.append(ReferenceCheck(name, dtype_name(dtype), shape, c.max_abs, c.max_rel, c.ok))
    return results
