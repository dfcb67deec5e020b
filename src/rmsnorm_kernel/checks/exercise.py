"""The ``exercise`` command: a row of ones through the correct kernel and the BLOCK-denominator mutant.

By hand: the correct kernel gives 1 / sqrt(1 + eps) per coordinate; the mutant divides the sum of
squares N by BLOCK = next_power_of_2(N), giving 1 / sqrt(N / BLOCK + eps): 1.411458 at N = 257, the
same as the correct value at N = 256. The backward rows use a random dy so that dx is not about 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ops.backend import kernel_device_type
from ..ops.op import rmsnorm
from ..ops.reference import DEFAULT_EPS, oracle
from ..ops.tolerances import compare
from ..testing import dx_block_mean, forward_block_mean, make_inputs
from .campaigns import triton_dx

EXERCISE_NS = (257, 256)


@dataclass
class ExerciseRow:
    what: str
    n: int
    kernel: str
    value: float  # first coordinate of the output (forward) or max |dx - dx_oracle| (backward)
    predicted: float  # the value worked out by hand (forward) or NaN (backward)
    max_abs_vs_reference: float
    agrees_with_reference: bool
    should_agree: bool
    ok: bool


def exercise(eps: float = DEFAULT_EPS, device: str | None = None) -> list[ExerciseRow]:
    """Forward and dx rows for each N of ``EXERCISE_NS`` and each of the correct and the mutant kernels."""
    device = device or kernel_device_type()
    rows = []
    for n in EXERCISE_NS:
        block = 1 << (n - 1).bit_length()
        x = torch.ones(1, n, device=device)
        gamma = torch.ones(n, device=device)
        _, _, dy = make_inputs((1, n), torch.float32, device, seed=n)
        y_ref, dx_ref, _ = oracle(x, gamma, dy, eps)
        for kernel, fn, predicted in (
            ("triton", rmsnorm, 1 / math.sqrt(1 + eps)),
            ("block-mean", forward_block_mean, 1 / math.sqrt(n / block + eps)),
        ):
            y = fn(x, gamma, eps)
            by_hand = compare(y, torch.full_like(y, predicted)).ok
            c = compare(y, y_ref)
            should_agree = kernel == "triton" or n == block
            rows.append(
                ExerciseRow(
                    "forward, row of ones",
                    n,
                    kernel,
                    float(y.flatten()[0]),
                    predicted,
                    c.max_abs,
                    c.ok,
                    should_agree,
                    by_hand and c.ok == should_agree,
                )
            )
        for kernel, fn in (("triton", triton_dx), ("block-mean", dx_block_mean)):
            c = compare(fn(dy, x, gamma, eps), dx_ref)
            should_agree = kernel == "triton" or n == block
            rows.append(
                ExerciseRow(
                    "backward dx, row of ones, random dy",
                    n,
                    kernel,
                    c.max_abs,
                    math.nan,
                    c.max_abs,
                    c.ok,
                    should_agree,
                    c.ok == should_agree,
                )
            )
    return rows
