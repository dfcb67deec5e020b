"""Deliberately wrong copies of the kernels, kept so that the checks can show they catch them.

Each is the kernel of ``kernels.py`` with one change: the mean divides by BLOCK (the padded, power-of-two
width) instead of N (the row's real length). For N a power of two, BLOCK == N and the defect hides; for
N = 257, BLOCK = 512 and every mean is about half what it should be (a row of ones gives about
1.411458 instead of 0.9999995). Never used by the operator.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import block_size, num_warps_for


@triton.jit
def _rmsnorm_fwd_kernel_block_mean(X, GAMMA, Y, row_stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / BLOCK  # THE DEFECT: BLOCK instead of N
    r = 1.0 / tl.sqrt(mean_sq + eps)
    y = x * r * gamma
    tl.store(Y + row * row_stride + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_dx_kernel_block_mean(DY, X, GAMMA, DX, row_stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / BLOCK + eps)  # THE DEFECT, in r
    u = dy * gamma
    mean_ux = tl.sum(u * x, axis=0) / BLOCK  # and in mean(u * x)
    dx = r * u - x * (r * r * r) * mean_ux
    tl.store(DX + row * row_stride + cols, dx.to(DX.dtype.element_ty), mask=mask)


def forward_block_mean(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """The forward with the BLOCK-denominator defect (contiguous x of shape (..., N))."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty_like(x2)
    block = block_size(n)
    _rmsnorm_fwd_kernel_block_mean[(x2.shape[0],)](x2, gamma, y, x2.stride(0), n, eps, BLOCK=block, num_warps=num_warps_for(block))
    return y.view(x.shape)


def dx_block_mean(dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """dx with the BLOCK-denominator defect in both of the backward's means."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    dy2 = dy.contiguous().reshape(-1, n)
    dx = torch.empty_like(x2)
    block = block_size(n)
    _rmsnorm_bwd_dx_kernel_block_mean[(x2.shape[0],)](dy2, x2, gamma, dx, x2.stride(0), n, eps, BLOCK=block, num_warps=num_warps_for(block))
    return dx.view(x.shape)
