"""Deliberately wrong copies of the kernels, kept so that the checks can show they catch them.

Each is a whole-row kernel of ``kernels.py`` (``_rmsnorm_fwd_kernel``, ``_rmsnorm_bwd_kernel``), line for
line, with one change: the means divide by BLOCK_N (the padded, power-of-two width) instead of N (the
row's real length). For N a power of two, BLOCK_N == N and the defect hides; for N = 257, BLOCK_N = 512
and every mean is about half what it should be (a row of ones gives about 1.411458 instead of
0.9999995). They are launched with the operator's own launch plan. Never used by the operator.

The looped kernels (N > kernels.ROW_LIMIT) divide by N at the same two places; their chunk width is
not a padded row, so this defect has no copy there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import _device_limits, plan, plan_for


@triton.jit
def _rmsnorm_fwd_kernel_block_mean(
    X, GAMMA, Y, M, N, stride_x, stride_y, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean_sq = tl.sum(x * x, axis=1) / BLOCK_N  # THE DEFECT: BLOCK_N instead of N
        r = 1.0 / tl.sqrt(mean_sq + eps)
        y = x * r[:, None] * gamma[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel_block_mean(
    DY, X, GAMMA, DX, DGAMMA_OUT, M, N, stride_dy, stride_x, stride_dx, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FINAL: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float64)
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / BLOCK_N + eps)  # THE DEFECT, in r
        u = dy * gamma[None, :]
        mean_ux = tl.sum(u * x, axis=1) / BLOCK_N  # and in mean(u * x)
        dx = r[:, None] * u - x * (r * r * r * mean_ux)[:, None]
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dgamma_acc += tl.sum(dy * x * r[:, None], axis=0).to(tl.float64)
    if FINAL:
        tl.store(DGAMMA_OUT + cols, dgamma_acc.to(tl.float32).to(DGAMMA_OUT.dtype.element_ty), mask=col_mask)
    else:
        tl.store(DGAMMA_OUT + pid.to(tl.int64) * N + cols, dgamma_acc, mask=col_mask)


def _whole_row_plan(x2: torch.Tensor, gamma: torch.Tensor, n: int):
    p = plan_for(x2, gamma)
    if p.looped:
        raise ValueError(f"mutants: N = {n} takes the looped kernels, which have no BLOCK-denominator copy")
    if p.fwd_chunked:  # aligned rows the chunked forward takes: the whole-row plan of unaligned rows instead
        sms, smem = _device_limits(x2.get_device())
        p = plan(x2.shape[0], n, sms, False, x2.element_size(), gamma.element_size(), smem)
    return p


def forward_block_mean(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """The forward with the BLOCK-denominator defect (x of shape (..., N), rows at one stride)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = _whole_row_plan(x2, gamma, n)
    _rmsnorm_fwd_kernel_block_mean[(p.fwd_programs,)](
        x2, gamma, y, rows, n, x2.stride(0), n, eps, BLOCK_M=p.fwd_block_m, BLOCK_N=p.block_n, STAGES=p.fwd_stages,
        num_warps=p.fwd_warps,
    )
    return y


def dx_block_mean(dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """dx with the BLOCK-denominator defect in both of the backward's means."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    dy2 = dy.contiguous().reshape(-1, n)
    rows = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    p = _whole_row_plan(x2, gamma, n)
    partial = torch.empty((max(p.partial_rows, 1), n), dtype=torch.float64, device=x.device)  # dgamma unused
    _rmsnorm_bwd_kernel_block_mean[p.bwd_grid[:1]](
        dy2, x2, gamma, dx, partial, rows, n, dy2.stride(0), x2.stride(0), n, eps,
        BLOCK_M=p.bwd_block_m, BLOCK_N=p.bwd_block_n, FINAL=False, STAGES=p.bwd_stages, num_warps=p.bwd_warps,
    )
    return dx
