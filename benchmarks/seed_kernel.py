"""The kernel a newcomer writes first, as a peer: one program per row, BLOCK_N = the next power of two of
N, as in Triton's layer-norm tutorial.

Forward: each program loads its row whole, y = x * r * gamma. Backward: each program recomputes r, writes
its row of dx and its row's dgamma contribution to a (rows, N) float32 scratch, which a second kernel
sums per column. Warps: one per 256 lanes, 1 to 8, the tutorial's rule. Nothing here is tuned: it is the
baseline the tuned kernels must beat everywhere they run. Rows wider than 65536 lanes are not taken
(its rows must fit one program's registers); ``seed_rmsnorm`` raises ``ValueError`` there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: The widest row one program's registers take; the same limit as the tuned kernels' contract, by chance
#: of the register file, not by design.
MAX_N = 65536
SUM_BLOCK_M, SUM_BLOCK_N = 32, 128


@triton.jit
def _seed_fwd_kernel(X, GAMMA, Y, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Y + row * N + cols, (x * r * gamma).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _seed_bwd_kernel(DY, X, GAMMA, DX, PARTIAL, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    u = dy * gamma
    dx = r * u - x * (r * r * r) * (tl.sum(u * x, axis=0) / N)
    tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(PARTIAL + row * N + cols, dy * x * r, mask=mask)


@triton.jit
def _seed_column_sum_kernel(PARTIAL, DGAMMA, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, M, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        acc += tl.load(PARTIAL + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
    tl.store(DGAMMA + cols, tl.sum(acc, axis=0).to(DGAMMA.dtype.element_ty), mask=cols < N)


def _warps(block_n: int) -> int:
    return min(max(block_n // 256, 1), 8)


class _SeedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        n = x.shape[-1]
        if n > MAX_N:
            raise ValueError(f"seed kernel: rows of N = {n} elements; accepted: N <= {MAX_N}")
        x2 = x.reshape(-1, n).contiguous()
        y = torch.empty_like(x2)
        block_n = triton.next_power_of_2(n)
        _seed_fwd_kernel[(x2.shape[0],)](x2, gamma, y, n, eps, BLOCK_N=block_n, num_warps=_warps(block_n))
        ctx.save_for_backward(x2, gamma)
        ctx.eps, ctx.shape = eps, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, gamma = ctx.saved_tensors
        rows, n = x2.shape
        dy2 = dy.reshape(-1, n).contiguous()
        dx = torch.empty_like(x2)
        partial = torch.empty((rows, n), dtype=torch.float32, device=x2.device)
        dgamma = torch.empty_like(gamma)
        block_n = triton.next_power_of_2(n)
        _seed_bwd_kernel[(rows,)](dy2, x2, gamma, dx, partial, n, ctx.eps, BLOCK_N=block_n, num_warps=_warps(block_n))
        _seed_column_sum_kernel[(triton.cdiv(n, SUM_BLOCK_N),)](
            partial, dgamma, rows, n, BLOCK_M=SUM_BLOCK_M, BLOCK_N=SUM_BLOCK_N
        )
        return dx.view(ctx.shape), dgamma, None


def seed_rmsnorm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm through the seed kernels; differentiable in x and gamma."""
    return _SeedRMSNorm.apply(x, gamma, eps)
