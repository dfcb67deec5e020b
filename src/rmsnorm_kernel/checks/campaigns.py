"""The numeric campaigns behind ``check-forward``, ``check-backward``, ``check-gamma`` and ``check-residual``.

Each campaign runs the Triton path (or a deliberately broken variant) over a list of shapes and dtypes
and compares one output with ``ops.reference.oracle``, the float64 oracle rounded to the inputs' dtypes:

- forward: ``rmsnorm(x, gamma)`` against the oracle's y;
- dx, dgamma: autograd through ``rmsnorm`` with a given dy against the oracle's dx and dgamma;
- residual: ``rmsnorm(x, gamma, residual=r)`` and autograd through both of its outputs (gradients dy of y
  and dh of h) against ``ops.reference.add_oracle``: y, h, dx, dresidual and dgamma, the case failing if
  any one misses, its errors the largest of the five.

Comparisons use ``ops.tolerances.compare``. The inputs come from ``rmsnorm_kernel.testing.make_inputs`` seeded by
the case's position in the campaign, so a report can be reproduced case by case.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from ..ops.backend import kernel_device_type
from ..ops.contract import MAX_N
from ..ops.op import rmsnorm
from ..ops.reference import DEFAULT_EPS, add_oracle, oracle
from ..ops.tolerances import TOLERANCES, Comparison, compare
from ..testing import dx_block_mean, forward_block_mean, make_inputs
from .report import dtype_name, one_line

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Rows longer than 4096, up to the largest N the contract accepts (the kernels walk such rows in chunks).
_LONG_ROWS = tuple(s for s in ((3, 10000), (1, MAX_N)) if 4096 < s[-1] <= MAX_N)
#: The full campaign: irregular shapes, M of 1 and 17, N of 255/256/257, powers of two and their
#: neighbours, long rows, and inputs of more than two dimensions. At least 28 shapes x 3 dtypes.
FULL_SHAPES: tuple[tuple[int, ...], ...] = (
    (1, 255),
    (1, 256),
    (1, 257),
    (17, 255),
    (17, 256),
    (17, 257),
    (1, 1),
    (17, 1),
    (3, 2),
    (5, 7),
    (17, 33),
    (4, 100),
    (9, 127),
    (2, 128),
    (6, 129),
    (3, 500),
    (2, 511),
    (2, 513),
    (1, 768),
    (4, 1000),
    (2, 1023),
    (1, 1025),
    (1, 2047),
    (1, 3000),
    (1, 4095),
    (1, 4096),
    (2, 3, 257),
    (2, 2, 5, 96),
    *_LONG_ROWS,
)
#: A short campaign for CI: still M of 1 and 17, N on both sides of a power of two.
QUICK_SHAPES: tuple[tuple[int, ...], ...] = ((1, 257), (17, 255), (17, 256), (2, 3, 100))

CAMPAIGNS = ("forward", "dx", "dgamma", "residual")
#: The residual campaign draws its residual and dh with the case's seed plus this, apart from x and dy.
RESIDUAL_SEED_OFFSET = 10_000
#: Which of the oracle's (y, dx, dgamma) each campaign checks.
_ORACLE_OUTPUT = {"forward": 0, "dx": 1, "dgamma": 2}


@dataclass
class CampaignCase:
    """One comparison of the Triton path (or a substitute) with the oracle."""

    campaign: str
    kernel: str
    dtype: str
    shape: tuple[int, ...]
    seed: int
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool
    error: str = ""


def _triton_grads(dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float):
    xl = x.detach().clone().requires_grad_()
    gl = gamma.detach().clone().requires_grad_()
    rmsnorm(xl, gl, eps).backward(dy)
    return xl.grad, gl.grad


def triton_dx(dy, x, gamma, eps):
    return _triton_grads(dy, x, gamma, eps)[0]


def triton_dgamma(dy, x, gamma, eps):
    return _triton_grads(dy, x, gamma, eps)[1]


def triton_residual(x, residual, gamma, dy, dh, eps):
    """(y, h, dx, dresidual, dgamma) of the fused residual add through autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, residual, gamma)]
    y, h = rmsnorm(leaves[0], leaves[2], eps, residual=leaves[1])
    torch.autograd.backward([y, h], [dy, dh])
    return y.detach(), h.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad


def _worst(comparisons: list[Comparison]) -> tuple[float, float, bool]:
    """(largest max_abs, largest max_rel, all ok) of several comparisons."""
    return (
        max(c.max_abs for c in comparisons),
        max(c.max_rel for c in comparisons),
        all(c.ok for c in comparisons),
    )


#: What each campaign can run: the Triton path, and for forward and dx the deliberately broken variant
#: of ``rmsnorm_kernel.testing.mutants`` (denominator BLOCK_N instead of N), which the campaign must
#: catch. A forward takes ``(x, gamma, eps)``, a backward ``(dy, x, gamma, eps)``.
KERNELS: dict[str, dict[str, Callable]] = {
    "forward": {"triton": rmsnorm, "block-mean": forward_block_mean},
    "dx": {"triton": triton_dx, "block-mean": dx_block_mean},
    "dgamma": {"triton": triton_dgamma},
    "residual": {"triton": triton_residual},
}


def run_campaign(
    campaign: str,
    kernel: str = "triton",
    shapes: Iterable[Sequence[int]] = FULL_SHAPES,
    dtypes: Iterable[torch.dtype] = DTYPES,
    eps: float = DEFAULT_EPS,
    device: str | None = None,
) -> list[CampaignCase]:
    """Compare ``kernel`` with the oracle for every (shape, dtype); an exception fails its case only."""
    if campaign not in KERNELS:
        raise ValueError(f"campaign is {campaign!r}; accepted: {', '.join(CAMPAIGNS)}")
    if kernel not in KERNELS[campaign]:
        raise ValueError(f"kernel {kernel!r} has no {campaign} variant; accepted: {', '.join(KERNELS[campaign])}")
    fn = KERNELS[campaign][kernel]
    device = device or kernel_device_type()
    dtypes = tuple(dtypes)
    cases = []
    for seed, (shape, dtype) in enumerate((tuple(s), d) for s in shapes for d in dtypes):
        tol = TOLERANCES[dtype]
        x, gamma, dy = make_inputs(shape, dtype, device, seed=seed)
        try:
            if campaign == "residual":
                residual, _, dh = make_inputs(shape, dtype, device, seed=seed + RESIDUAL_SEED_OFFSET)
                want_all = add_oracle(x, residual, gamma, dy, dh, eps)
                got_all = fn(x, residual, gamma, dy, dh, eps)
                max_abs, max_rel, ok = _worst([compare(g, w) for g, w in zip(got_all, want_all)])
            else:
                want = oracle(x, gamma, dy, eps)[_ORACLE_OUTPUT[campaign]]
                got = fn(x, gamma, eps) if campaign == "forward" else fn(dy, x, gamma, eps)
                c = compare(got, want)
                max_abs, max_rel, ok = c.max_abs, c.max_rel, c.ok
            case = CampaignCase(
                campaign, kernel, dtype_name(dtype), shape, seed, max_abs, max_rel, tol.atol, tol.rtol, ok
            )
        except Exception as exc:  # a crash is a failed case, reported with the others
            case = CampaignCase(
                campaign,
                kernel,
                dtype_name(dtype),
                shape,
                seed,
                math.nan,
                math.nan,
                tol.atol,
                tol.rtol,
                False,
                one_line(exc),
            )
        cases.append(case)
    return cases


def worst_per_dtype(cases: Iterable[CampaignCase]) -> dict[str, CampaignCase]:
    """Per dtype, a failing case if there is one, else the case with the largest absolute error."""

    def badness(c: CampaignCase):
        return (not c.ok, c.max_abs if not math.isnan(c.max_abs) else math.inf)

    worst: dict[str, CampaignCase] = {}
    for c in cases:
        if c.dtype not in worst or badness(c) > badness(worst[c.dtype]):
            worst[c.dtype] = c
    return worst
