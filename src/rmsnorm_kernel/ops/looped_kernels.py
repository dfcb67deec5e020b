"""The backward of rows too long for one program's registers (N > ``launch.ROW_LIMIT``), in two steps,
because dx needs two whole-row sums before its first element: per row, r and
coef = r^3 * mean(u * x) (``_rmsnorm_bwd_row_stats_kernel``); then dx = r * u - x * coef and the per-program
dgamma partials, over segments of rows and columns (``_rmsnorm_bwd_looped_kernel``). The formulas and the
helpers are those of ``kernels.py``: a segment's dx and dgamma terms are the whole-row backward's,
with r and coef read back rather than summed.
"""

import triton
import triton.language as tl

from .kernels import _bwd_store_dx, _bwd_u, _inv_sqrt, _load_rows, _rounded, _scale, _silu_grad


@triton.jit
def _rmsnorm_bwd_row_stats_kernel(
    DY,
    X,
    GAMMA,
    RSTD,
    COEF,
    N,
    stride_dy,
    stride_x,
    eps,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    FP64: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    # Per row: r, and coef = r^3 * mean(u * x), the two numbers dx = r * u - x * coef needs.
    N, stride_dy, stride_x = N // VEC * VEC, stride_dy // VEC * VEC, stride_x // VEC * VEC  # vector loads
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    # The sum of squares in float64, so that r is rounded once, when stored: dgamma sums dy * x * r over
    # every row, so an error in each row's r adds up in float32 dgamma (docs/design.md).
    sum_sq = tl.zeros((BLOCK_N,), dtype=tl.float64)
    sum_ux = tl.zeros((BLOCK_N,), dtype=ACC)
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        mask = start + cols < N
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + row * stride_dy + start + cols, mask=mask, other=0.0).to(ACC)
        gamma = _scale(tl.load(GAMMA + start + cols, mask=mask, other=0.0).to(ACC), WEIGHT_OFFSET)
        sum_sq += x.to(tl.float64) * x.to(tl.float64)
        if not SILU:
            sum_ux += dy * gamma * x
    r = _inv_sqrt(tl.sum(sum_sq, axis=0) / N + tl.cast(eps, tl.float64), True).to(ACC)
    if SILU:  # u needs silu'(y), and y needs r: a second walk over the row, once r is known
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            mask = start + cols < N
            x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + row * stride_dy + start + cols, mask=mask, other=0.0).to(ACC)
            gamma = _scale(tl.load(GAMMA + start + cols, mask=mask, other=0.0).to(ACC), WEIGHT_OFFSET)
            n = x * r
            if ROUND_NORM:
                n = _rounded(n, X.dtype.element_ty).to(ACC)
            sum_ux += dy * _silu_grad(n * gamma) * gamma * x
    tl.store(RSTD + row, r)
    tl.store(COEF + row, r * r * r * (tl.sum(sum_ux, axis=0) / N))


@triton.jit
def _rmsnorm_bwd_looped_kernel(
    DY,
    X,
    DH,
    GAMMA,
    DX,
    PARTIAL,
    RSTD,
    COEF,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dh,
    stride_dx,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    HAS_DH: tl.constexpr,
    FP64: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    # Program (p, s): column segment s of the rows p, p + P, ...; its dgamma share stays in registers
    # because a segment, unlike a 65536-wide row, fits there.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    N = N // VEC * VEC  # vector loads
    stride_dy, stride_x, stride_dx = stride_dy // VEC * VEC, stride_x // VEC * VEC, stride_dx // VEC * VEC
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = _scale(tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(ACC), WEIGHT_OFFSET)
    dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float64)  # float64, as in _rmsnorm_bwd_kernel
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64 before any * stride
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        r = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        coef = tl.load(COEF + rows, mask=row_mask, other=0.0)
        x = _load_rows(X, rows, stride_x, cols, mask, ACC, "")
        dy = _load_rows(DY, rows, stride_dy, cols, mask, ACC, "")
        n, dy, u = _bwd_u(x, dy, gamma[None, :], r[:, None], X.dtype.element_ty, SILU, ROUND_NORM)
        _bwd_store_dx(DX, DH, rows, cols, mask, stride_dx, stride_dh, x, u, r, coef, HAS_DH)
        dgamma_acc += tl.sum(dy * n, axis=0).to(tl.float64)
    tl.store(PARTIAL + pid.to(tl.int64) * N + cols, dgamma_acc, mask=col_mask)
