"""Triton kernels for RMSNorm and the code that launches them.

Each kernel sits next to the formula it computes (see ``reference.py`` for the oracle):

    forward   r = 1 / sqrt(sum(x^2) / N + eps);  y = x * r * gamma
    backward  u = dy * gamma;  dx = r * u - x * r^3 * sum(u * x) / N
              dgamma = sum over rows of (dy * x * r)

One program handles one row. A row of N elements is loaded into BLOCK = next_power_of_2(N) lanes; the
lanes past N are masked and read as 0, so they add nothing to the sums, but they are not elements:
every mean divides by N, never by BLOCK.

The backward recomputes r from the row of x it loads anyway rather than reading a saved copy: the
custom op returns y alone, and the recomputation costs arithmetic, not memory traffic.

dgamma is reduced without atomics: each row writes its own float32 contribution to a (rows, N) scratch
and a second kernel sums the scratch per column in a fixed order, so the result is the same bits run
after run.

The launchers assume arguments that passed ``contract.check_forward``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(X, GAMMA, Y, row_stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: row * row_stride may pass 2**31
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    # Cast to float32 at load time, before the reduction: squares of float16/bfloat16 values lose
    # precision (and float16 overflows above 256^2) if summed in the input format.
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / N  # N, not BLOCK: masked lanes are padding, not data
    r = 1.0 / tl.sqrt(mean_sq + eps)
    y = x * r * gamma
    tl.store(Y + row * row_stride + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_dx_kernel(DY, X, GAMMA, DX, DGAMMA_PARTIAL, row_stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)  # the forward's r, same logical N
    u = dy * gamma
    mean_ux = tl.sum(u * x, axis=0) / N  # N again: the padding lanes hold u * x = 0
    dx = r * u - x * (r * r * r) * mean_ux
    tl.store(DX + row * row_stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
    # This row's private dgamma contribution, kept in float32 until the column sum.
    tl.store(DGAMMA_PARTIAL + row * N + cols, dy * x * r, mask=mask)


@triton.jit
def _dgamma_column_sum_kernel(PARTIAL, DGAMMA, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, M, BLOCK_M):  # a fixed order of rows: deterministic, no atomics
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & col_mask[None, :]
        offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
        acc += tl.load(PARTIAL + offsets, mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(DGAMMA + cols, total.to(DGAMMA.dtype.element_ty), mask=col_mask)


DGAMMA_BLOCK_M = 32
DGAMMA_BLOCK_N = 128


def block_size(n: int) -> int:
    return triton.next_power_of_2(n)


def num_warps_for(block: int) -> int:
    # As in Triton's layer-norm tutorial: one warp per 256 lanes, between 1 and 8.
    return min(max(block // 256, 1), 8)


def rmsnorm_forward(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """y = rmsnorm(x) * gamma in x's dtype, for contiguous x of shape (..., N)."""
    n = x.shape[-1]
    x2 = x.view(-1, n)
    y = torch.empty_like(x2)
    block = block_size(n)
    _rmsnorm_fwd_kernel[(x2.shape[0],)](x2, gamma, y, x2.stride(0), n, eps, BLOCK=block, num_warps=num_warps_for(block))
    return y.view(x.shape)


def rmsnorm_backward(
    dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dgamma in gamma's dtype) for contiguous dy and x of the same shape."""
    n = x.shape[-1]
    x2 = x.view(-1, n)
    dy2 = dy.view(-1, n)
    rows = x2.shape[0]
    dx = torch.empty_like(x2)
    partial = torch.empty((rows, n), dtype=torch.float32, device=x.device)
    dgamma = torch.empty_like(gamma)
    block = block_size(n)
    _rmsnorm_bwd_dx_kernel[(rows,)](
        dy2, x2, gamma, dx, partial, x2.stride(0), n, eps, BLOCK=block, num_warps=num_warps_for(block)
    )
    _dgamma_column_sum_kernel[(triton.cdiv(n, DGAMMA_BLOCK_N),)](
        partial, dgamma, rows, n, BLOCK_M=DGAMMA_BLOCK_M, BLOCK_N=DGAMMA_BLOCK_N
    )
    return dx.view(x.shape), dgamma
