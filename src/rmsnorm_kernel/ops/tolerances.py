"""The declared tolerances of the Triton path against the oracle, and the rule that applies them.

Declared here, once, before any comparison; tests and check commands import them and never loosen them.
A result passes when ``|actual - expected| <= atol + rtol * |expected|`` elementwise (``torch.allclose``).

- float32: atol 1e-5, rtol 1e-4 (Triton's tutorial). Both sides compute in float32; they differ only in
  the order of the sums.
- float16: atol = rtol = 3e-3, about three units of float16's epsilon (2^-10 ~ 9.8e-4).
- bfloat16: atol = rtol = 3 * 2^-7 ~ 2.3e-2, the same three units of bfloat16's epsilon (2^-7, it keeps
  8 significant bits against float16's 11). Both sides compute in float32 and round once to bfloat16,
  so a reordered float32 sum can move a result by one bfloat16 unit; three leave room for dx, where
  two rounded terms nearly cancel.
- float64 (used by gradient checks of the reference only): atol 1e-10, rtol 1e-8.

The numerics modes (``reference.MODES``) keep these tolerances, with one rule for ``"llama"``: it rounds
the normalized x to x's dtype before the weight, and two correct computations of n (float32 here,
float64 in the oracle) can round one element to neighbouring values of x's dtype. So in that mode y and
dgamma, which carry the rounded n, are compared with the tolerance of x's dtype when theirs is finer
(a float32 y or dgamma of a bfloat16 x): ``tolerance_dtype``.

Training curves of the paths (same seed, same batches) are compared step by step with
``TRAINING_CURVE_RTOL``, in float32 on the CPU: the paths differ only by float32 reordering inside the
norm (about 1e-7 relative), and training amplifies such differences step by step. On the CPU the
language model's 100-step curves stay within 6e-6 of the reference's. On a GPU they grow about tenfold
every 10 steps, past this tolerance within 100 steps for PyTorch's own ``F.rms_norm`` as for Triton, while
the reference repeats itself bit for bit: there the drift is reported (docs/training.md), not held to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-4),
    torch.float16: Tolerance(atol=3e-3, rtol=3e-3),
    torch.bfloat16: Tolerance(atol=3 * 2**-7, rtol=3 * 2**-7),
    torch.float64: Tolerance(atol=1e-10, rtol=1e-8),
}

TRAINING_CURVE_RTOL = 1e-3


def tolerance_dtype(result_dtype: torch.dtype, x_dtype: torch.dtype, mode: str = "torch") -> torch.dtype:
    """The dtype whose tolerance a result of ``result_dtype`` is held to (see the module's doc): its own,
    or x's in ``"llama"`` mode where x's is coarser."""
    if mode == "llama" and TOLERANCES[x_dtype].rtol > TOLERANCES[result_dtype].rtol:
        return x_dtype
    return result_dtype


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float
    ok: bool
    tolerance: Tolerance
    #: the largest |actual - expected| / (atol + rtol * |expected|) over finite elements: <= 1 passes
    worst_over_tol: float = 0.0


def compare(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, chunk: int = 1 << 24
) -> Comparison:
    """Apply the allclose rule with the tolerance declared for ``dtype`` (default: ``expected.dtype``).

    Non-finite values must match exactly (NaN where the oracle has NaN, the same infinities). The
    comparison runs in float64 on the tensors' device, ``chunk`` elements at a time, so that a tensor
    of a GB is checked where it lies without a float64 copy of it all.
    """
    tol = TOLERANCES[dtype or expected.dtype]
    if actual.shape != expected.shape:
        raise ValueError(f"compare: shapes differ, {tuple(actual.shape)} against {tuple(expected.shape)}")
    a_all = actual.detach().reshape(-1)
    e_all = expected.detach().reshape(-1).to(a_all.device)
    tiny = torch.finfo(torch.float64).tiny
    ok, max_abs, max_rel, worst = True, 0.0, 0.0, 0.0
    for start in range(0, a_all.numel(), chunk):
        a = a_all[start : start + chunk].to(torch.float64)
        e = e_all[start : start + chunk].to(torch.float64)
        inf_e = torch.isinf(e)
        same_nonfinite = (
            torch.equal(torch.isnan(a), torch.isnan(e))
            and torch.equal(a[inf_e], e[inf_e])
            and torch.equal(torch.isinf(a), inf_e)
        )
        finite = torch.isfinite(e) & torch.isfinite(a)
        d, ef = (a - e).abs()[finite], e.abs()[finite]
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float((d / ef.clamp_min(tiny)).max()))
            worst = max(worst, float((d / (tol.atol + tol.rtol * ef)).max()))
        ok = ok and same_nonfinite and bool((d <= tol.atol + tol.rtol * ef).all())
        if not same_nonfinite:
            worst = math.inf  # a NaN or infinity where the other side has none: past any tolerance
    return Comparison(max_abs=max_abs, max_rel=max_rel, ok=ok, tolerance=tol, worst_over_tol=worst)
