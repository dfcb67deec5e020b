"""Deliberately wrong kernels, made from the real ones, so that the checks can show they catch them.

Each mutant is the source of a whole-row kernel of ``ops/kernels.py`` with one textual substitution:
every mean divides by BLOCK_N (the padded, power-of-two width) instead of N (the row's real length),
that is ``/ N`` becomes ``/ BLOCK_N``. For N a power of two the two are equal and the defect hides; for
N = 257, BLOCK_N = 512 and every mean is about half what it should be (a row of ones gives about
1.411458 instead of 0.9999995). They run with the operator's own launch plan, except that the forward
mutant always holds whole rows (the operator walks some rows in chunks, as ``launch.py`` plans). Never
used by the operator.

Rows wider than launch.ROW_LIMIT are refused: the looped kernels divide by N too, but their chunk is not
a padded row, so the defect has no counterpart there.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap

import torch

from ..ops import kernels
from ..ops.launch import plan_for, whole_row_tile

#: The substitution: a division by the row length N becomes a division by the block width BLOCK_N.
MEAN_OVER_N = re.compile(r"/ N\b")
MEAN_OVER_BLOCK = "/ BLOCK_N"


def block_mean_source(kernel) -> str:
    """The Python source of ``kernel`` with the substitution made; refuses a kernel it does not change."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    mutated, count = MEAN_OVER_N.subn(MEAN_OVER_BLOCK, source)
    if count == 0:
        raise ValueError(f"mutants: {kernel.fn.__name__} has no '/ N' to replace")
    return mutated.replace(f"def {kernel.fn.__name__}(", f"def {kernel.fn.__name__}_block_mean(", 1)


@functools.cache
def block_mean_kernel(name: str):
    """The mutant of ``kernels.<name>``, compiled by Triton like the original (from a file, as
    ``triton.jit`` reads its kernel's source)."""
    import importlib.util
    import tempfile
    from pathlib import Path

    source = (
        "import triton\nimport triton.language as tl\n\n"
        "from rmsnorm_kernel.ops.kernels import (  # the kernels' helpers\n"
        "    _bwd_store_dx, _bwd_u, _inv_sqrt, _load_gamma, _load_rows, _rounded, _scale, _silu_grad,\n)\n\n\n"
        + block_mean_source(getattr(kernels, name))
    )
    folder = Path(tempfile.mkdtemp(prefix="rmsnorm_kernel_mutants_"))
    path = folder / f"{name}_block_mean.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"rmsnorm_kernel_mutant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"{name}_block_mean")


def _whole_row_plan(x2: torch.Tensor, gamma: torch.Tensor):
    p = plan_for(x2, gamma)
    if p.bwd_branch != "whole_rows":
        raise ValueError(
            f"mutants: N = {x2.shape[1]} is wider than launch.ROW_LIMIT: its backward ({p.bwd_branch}) has no "
            "BLOCK-denominator mutant"
        )
    if p.fwd_two_pass:  # the whole-row forward's settings for these rows instead
        block_n = 1 << (x2.shape[1] - 1).bit_length()  # the next power of two
        block_m, warps = whole_row_tile(block_n)
        p = dataclasses.replace(
            p,
            fwd_two_pass=False,
            block_n=block_n,
            fwd_block_m=block_m,
            fwd_warps=warps,
            fwd_programs=-(-x2.shape[0] // block_m),
            fwd_stages=1,
        )
    return p


def forward_block_mean(x: torch.Tensor, gamma: torch.Tensor, eps: float, activation: str | None = None) -> torch.Tensor:
    """The forward with the BLOCK-denominator defect (x of shape (..., N), rows at one stride), followed
    by ``activation`` as in the real kernel."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = _whole_row_plan(x2, gamma)
    block_mean_kernel("_rmsnorm_fwd_kernel")[(p.fwd_programs,)](
        x2,
        x2,  # no residual: the norm's input is x
        x2,
        gamma,
        y,
        x2.shape[0],
        n,
        x2.stride(0),
        x2.stride(0),
        x2.stride(0),
        n,
        eps,
        BLOCK_M=p.fwd_block_m,
        BLOCK_N=p.block_n,
        STAGES=p.fwd_stages,
        VEC=p.vec,
        SILU=activation == "silu",
        ROUND_NORM=False,
        WEIGHT_OFFSET=False,
        RESIDUAL=False,
        FP64=x.dtype == torch.float64,
        num_warps=p.fwd_warps,
    )
    return y


def dx_block_mean(dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """dx with the BLOCK-denominator defect in both of the backward's means."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    dy2 = dy.contiguous().reshape(-1, n)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = _whole_row_plan(x2, gamma)
    partial = torch.empty((max(p.partial_rows, 1), n), dtype=torch.float64, device=x.device)  # dgamma unused
    block_mean_kernel("_rmsnorm_bwd_kernel")[p.bwd_grid[:1]](
        dy2,
        x2,
        dy2,  # no gradient of a residual's sum to add
        gamma,
        dx,
        partial,
        x2.shape[0],
        n,
        dy2.stride(0),
        x2.stride(0),
        dy2.stride(0),
        n,
        eps,
        BLOCK_M=p.bwd_block_m,
        BLOCK_N=p.bwd_block_n,
        BLOCK_N2=p.bwd_block_n2,
        STAGES=p.bwd_stages,
        VEC=1,
        SILU=False,
        ROUND_NORM=False,
        WEIGHT_OFFSET=False,
        HAS_DH=False,
        FP64=x.dtype == torch.float64,
        ROWWISE_DGAMMA=p.bwd_rowwise_dgamma,
        num_warps=p.bwd_warps,
    )
    return dx
