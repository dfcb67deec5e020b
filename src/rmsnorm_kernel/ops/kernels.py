"""The Triton kernels for RMSNorm, each beside the formula it computes.

Each kernel sits next to the formula it computes (``reference.py`` has the oracle):

    forward   r = 1 / sqrt(sum(x^2) / N + eps);  n = x * r;  y = n * gamma
    backward  u = dy * gamma;  dx = r * u - x * r^3 * sum(u * x) / N
              dgamma = sum over rows of (dy * n)

The numerics modes of ``reference.py`` are two switches of every kernel: ROUND_NORM (``"llama"``) rounds
n to x's dtype before the weight multiplies it, WEIGHT_OFFSET (``"gemma"``) makes the scale 1 + gamma.

With SILU (``activation="silu"``) every kernel also applies the layer that follows the norm: the forward
stores silu(y) instead of y, and the backward, given the gradient of silu(y), first recomputes y from x
and r and multiplies by silu'(y) (``_silu_grad``). y never goes to memory and back, which saves a
read and a write of the activations in each direction over a separate SiLU.

Three shapes of kernel (``launch.py`` decides which runs, with which tile and grid):

- Whole rows: a program holds BLOCK_M complete rows of BLOCK_N = next_power_of_2(N) lanes in registers,
  so x and dy are read from memory once. The lanes past N are masked and read as 0: they add nothing to
  the sums, but they are not elements, so every mean divides by N, never by BLOCK_N.
- Rows too long for one program's registers to hold x, dy and dgamma's share at once: in the
  backward, whole rows one at a time, read twice, the second time from L2 (``_rmsnorm_bwd_reread_kernel``).
- Rows walked in column chunks of BLOCK_N: the forward in two passes (the sum of squares, then y; the
  second read from L2), one program a row; the backward in two steps (row statistics, then dx and
  dgamma) for the long rows not read twice (up to contract.MAX_N = 65536), whose two kernels are in
  ``looped_kernels.py``.

Vector loads: the launcher passes VEC, the widest load N and the row strides allow, and each kernel first
writes ``N = N // VEC * VEC``, the same value, which the compiler now knows to be a multiple of VEC. The
backward recomputes r from the row of x it loads anyway. dgamma is reduced without atomics: each backward
program keeps a float64 sum of its rows' dy * x * r and writes it once as a row of a (P, N) float64 buffer
of partials, which a second kernel sums per column in a fixed order, so the bits are the same run after run
(docs/design.md has each of these in full).

Rows are addressed through their row stride (the last dimension contiguous), so a slice such as
``x[:, :N]`` of a wider tensor is read in place; any other layout is copied once (``as_rows``), and a
gamma that is not contiguous too. Row offsets are 64-bit: ``row * stride`` may pass 2**31.

The kernels write only their outputs and scratch buffers: counting calls is the op's job
(``counters.py``), so the kernels' registers and schedule do not depend on it.

The launchers that plan and run these kernels are in ``launchers.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .backend import INTERPRETER, backend

#: Whether ``_rounded`` rounds float32 to bfloat16 itself: only under Triton's interpreter (see there).
_ROUND_BY_HAND = tl.constexpr(backend() == INTERPRETER)


@triton.jit
def _scale(gamma, WEIGHT_OFFSET: tl.constexpr):
    # what multiplies n: gamma, or 1 + gamma in gemma mode (reference._scale)
    if WEIGHT_OFFSET:
        gamma = gamma + 1.0
    return gamma


@triton.jit
def _rounded(v, DTYPE: tl.constexpr):
    # v (float32) in DTYPE, rounded to nearest, ties to even, as torch rounds; every result stored in a
    # half format goes through here. Written out for bfloat16 under Triton's interpreter, which truncates
    # float32 to bfloat16 (after it the cast is exact); a GPU's own conversion rounds to nearest-even.
    if DTYPE == tl.bfloat16 and _ROUND_BY_HAND:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = tl.where(v == v, bits.to(tl.float32, bitcast=True), v)  # NaN stays NaN
    return v.to(DTYPE)


@triton.jit
def _inv_sqrt(v, FP64: tl.constexpr):
    # 1 / sqrt(v), correctly rounded. tl.sqrt_rn and tl.div_rn take float32 only (tl.sqrt and 1 / x are
    # approximate there on a GPU); float64's square root and division are IEEE's, correctly rounded.
    if FP64:
        return 1.0 / tl.sqrt(v)
    else:
        return tl.div_rn(1.0, tl.sqrt_rn(v))


@triton.jit
def _silu_grad(y):
    # d silu(y) / dy = s * (1 + y * (1 - s)), s = sigmoid(y): reference.silu_grad
    s = tl.sigmoid(y)
    return s * (1 + y * (1 - s))


# --------------------------------------------------------------------------------------------------
# Whole rows: forward
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_fwd_kernel(
    X,
    RES,
    H,
    GAMMA,
    Y,
    M,
    N,
    stride_x,
    stride_res,
    stride_h,
    stride_y,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    RESIDUAL: tl.constexpr,
    FP64: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    # BLOCK_M rows per tile: short rows share a tile so that each one moves enough bytes. Program p takes
    # the tiles p, p + P, ...: one tile each when the grid covers them all, several when it is persistent,
    # in which case STAGES > 1 lets Triton copy the next tile's x into shared memory (cp.async) while
    # this one is computed.
    N, stride_x, stride_y = N // VEC * VEC, stride_x // VEC * VEC, stride_y // VEC * VEC  # vector loads
    stride_res, stride_h = stride_res // VEC * VEC, stride_h // VEC * VEC
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = _scale(tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(ACC), WEIGHT_OFFSET)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64: rows * stride may pass 2**31
        mask = (rows < M)[:, None] & col_mask[None, :]
        # Cast to float32 at load time, before the reduction: squares of float16/bfloat16 values lose
        # precision (and float16 overflows above 256^2) if summed in the input format.
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        if RESIDUAL:  # h = x + residual, stored in h's dtype, and normalized as stored
            x += tl.load(RES + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0).to(ACC)
            h = _rounded(x, H.dtype.element_ty)
            tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
            x = h.to(ACC)
        mean_sq = tl.sum(x * x, axis=1) / N  # N, not BLOCK_N: masked lanes are padding, not data
        # Correctly rounded: tl.sqrt and 1 / x are approximate on a GPU, and the backward multiplies r^3
        # into terms hundreds of times larger than dx when x is small (r ~ 700 at |x| ~ 1e-3).
        r = _inv_sqrt(mean_sq + tl.cast(eps, ACC), FP64)
        n = x * r[:, None]
        if ROUND_NORM:  # llama: n in the dtype of the norm's input (H: x, or x + residual) before the weight
            n = _rounded(n, H.dtype.element_ty).to(ACC)
        y = n * gamma[None, :]
        if SILU:
            y = y * tl.sigmoid(y)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], _rounded(y, Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Whole rows: backward (dx and the per-program dgamma partials in one pass over x and dy)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _load_rows(P, rows, stride, cols, mask, ACC: tl.constexpr, EVICT: tl.constexpr):
    return tl.load(P + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT).to(ACC)


@triton.jit
def _load_gamma(GAMMA, cols, mask, ACC: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    return _scale(tl.load(GAMMA + cols, mask=mask, other=0.0).to(ACC), WEIGHT_OFFSET)


@triton.jit
def _bwd_u(x, dy, gamma, r, X_DTYPE: tl.constexpr, SILU: tl.constexpr, ROUND_NORM: tl.constexpr):
    # (n, dy, u = dy * gamma) of one piece of a row or a tile (r and gamma broadcast to x's shape); dy
    # taken back through the SiLU with SILU
    n = x * r
    if ROUND_NORM:  # as the forward did; its gradient is the identity, as autograd takes it
        n = _rounded(n, X_DTYPE).to(x.dtype)
    if SILU:  # dy is the gradient of silu(y): take it back through the SiLU
        dy = dy * _silu_grad(n * gamma)
    return n, dy, dy * gamma


@triton.jit
def _bwd_store_dx(DX, DH, rows, cols, mask, stride_dx, stride_dh, x, u, r, c, HAS_DH: tl.constexpr):
    # dx = r * u - x * r^3 * mean(u * x) (c = r^3 * mean(u * x)) of one piece of the tile, plus dh
    dx = r[:, None] * u - x * c[:, None]
    if HAS_DH:  # x was h = x + residual, which also went on: its own gradient joins
        dx += _load_rows(DH, rows, stride_dh, cols, mask, x.dtype, "")
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], _rounded(dx, DX.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    DY,
    X,
    DH,
    GAMMA,
    DX,
    PARTIAL,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dh,
    stride_dx,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    STAGES: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    HAS_DH: tl.constexpr,
    FP64: tl.constexpr,
    ROWWISE_DGAMMA: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    N = N // VEC * VEC  # vector loads
    stride_dy, stride_x, stride_dx = stride_dy // VEC * VEC, stride_x // VEC * VEC, stride_dx // VEC * VEC
    stride_dh = stride_dh // VEC * VEC
    # A row is one piece of BLOCK_N lanes, or two: BLOCK_N and BLOCK_N2 lanes after it (both powers of two,
    # BLOCK_N2 < BLOCK_N), so that N = 5120 takes 4096 + 1024 lanes where one piece would take 8192. Every
    # row statistic sums over both pieces; every element-wise step runs on each.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if BLOCK_N2 > 0:
        cols2 = BLOCK_N + tl.arange(0, BLOCK_N2)
        col_mask2 = cols2 < N
    gamma = _load_gamma(GAMMA, cols, col_mask, ACC, WEIGHT_OFFSET)[None, :]
    if BLOCK_N2 > 0:
        gamma2 = _load_gamma(GAMMA, cols2, col_mask2, ACC, WEIGHT_OFFSET)[None, :]
    # This program's share of dgamma, kept in registers across all its rows (no M x N scratch). Summed
    # over each tile's rows as it comes, in float64: a float32 running sum over thousands of rows drifts
    # by more than float32's tolerance; one float64 add per element costs no memory traffic. With
    # ROWWISE_DGAMMA (16-bit rows on the narrow rows' settings, which lie across warps) each (row, column) element of
    # the tile keeps its own float32 sum over this program's tiles only (as many terms as tiles per program,
    # a few dozen), and the rows are summed in float64 once, at the end: no sum across warps per tile. The
    # 16-bit dtypes' tolerances leave room for those float32 sums; float32's does not.
    if ROWWISE_DGAMMA:
        dgamma_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        if BLOCK_N2 > 0:
            dgamma_acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=ACC)
    else:
        dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float64)
        if BLOCK_N2 > 0:
            dgamma_acc2 = tl.zeros((BLOCK_N2,), dtype=tl.float64)
    # Persistent: tiles pid, pid + P, ... in a fixed order, so the sum is the same every run. With
    # STAGES > 1 the next tile's x and dy are copied into shared memory (cp.async) while this one is
    # computed: without it a multiprocessor has one tile in flight and waits on memory latency.
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64 before any * stride
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = _load_rows(X, rows, stride_x, cols, mask, ACC, "")
        dy = _load_rows(DY, rows, stride_dy, cols, mask, ACC, "")
        sum_sq = tl.sum(x * x, axis=1)
        if BLOCK_N2 > 0:
            mask2 = row_mask[:, None] & col_mask2[None, :]
            x2 = _load_rows(X, rows, stride_x, cols2, mask2, ACC, "")
            dy2 = _load_rows(DY, rows, stride_dy, cols2, mask2, ACC, "")
            sum_sq += tl.sum(x2 * x2, axis=1)
        r = _inv_sqrt(sum_sq / N + tl.cast(eps, ACC), FP64)  # the forward's r, same logical N
        n, dy, u = _bwd_u(x, dy, gamma, r[:, None], X.dtype.element_ty, SILU, ROUND_NORM)
        sum_ux = tl.sum(u * x, axis=1)  # the padding lanes hold u * x = 0
        if BLOCK_N2 > 0:
            n2, dy2, u2 = _bwd_u(x2, dy2, gamma2, r[:, None], X.dtype.element_ty, SILU, ROUND_NORM)
            sum_ux += tl.sum(u2 * x2, axis=1)
        c = r * r * r * (sum_ux / N)  # N again, not the lanes
        _bwd_store_dx(DX, DH, rows, cols, mask, stride_dx, stride_dh, x, u, r, c, HAS_DH)
        if BLOCK_N2 > 0:
            _bwd_store_dx(DX, DH, rows, cols2, mask2, stride_dx, stride_dh, x2, u2, r, c, HAS_DH)
        # Masked rows and lanes hold dy = x = 0: they add nothing.
        if ROWWISE_DGAMMA:
            dgamma_acc += dy * n
            if BLOCK_N2 > 0:
                dgamma_acc2 += dy2 * n2
        else:
            dgamma_acc += tl.sum(dy * n, axis=0).to(tl.float64)
            if BLOCK_N2 > 0:
                dgamma_acc2 += tl.sum(dy2 * n2, axis=0).to(tl.float64)
    partial_row = PARTIAL + pid.to(tl.int64) * N  # row pid of the (P, N) partials
    if ROWWISE_DGAMMA:
        tl.store(partial_row + cols, tl.sum(dgamma_acc.to(tl.float64), axis=0), mask=col_mask)
        if BLOCK_N2 > 0:
            tl.store(partial_row + cols2, tl.sum(dgamma_acc2.to(tl.float64), axis=0), mask=col_mask2)
    else:
        tl.store(partial_row + cols, dgamma_acc, mask=col_mask)
        if BLOCK_N2 > 0:
            tl.store(partial_row + cols2, dgamma_acc2, mask=col_mask2)


# --------------------------------------------------------------------------------------------------
# Whole rows read twice: backward of rows past ROW_LIMIT, one row at a time
# --------------------------------------------------------------------------------------------------


@triton.jit
def _load_row(ROW, cols, mask, ACC: tl.constexpr, EVICT: tl.constexpr):
    return tl.load(ROW + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(ACC)


@triton.jit
def _rmsnorm_bwd_reread_kernel(
    DY,
    X,
    DH,
    GAMMA,
    DX,
    PARTIAL,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dh,
    stride_dx,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    STAGES: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    HAS_DH: tl.constexpr,
    FP64: tl.constexpr,
    ROWWISE_DGAMMA: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    # The whole-row backward's formulas for rows too wide for x, dy, their sums and dgamma's share to fit
    # one program's registers together: x and dy are read for the row sums, kept in cache (evict_last),
    # and read again, from there, for dx and dgamma, so memory traffic stays one read of each. One row at
    # a time.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    N = N // VEC * VEC  # vector loads
    stride_dy, stride_x, stride_dx = stride_dy // VEC * VEC, stride_x // VEC * VEC, stride_dx // VEC * VEC
    stride_dh = stride_dh // VEC * VEC
    # The row in one or two pieces, as in _rmsnorm_bwd_kernel.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if BLOCK_N2 > 0:
        cols2 = BLOCK_N + tl.arange(0, BLOCK_N2)
        col_mask2 = cols2 < N
    # This program's share of dgamma, summed over its rows per element: in float32 with ROWWISE_DGAMMA
    # (16-bit x, as in _rmsnorm_bwd_kernel), in float64 otherwise.
    DGAMMA_ACC = tl.float32 if ROWWISE_DGAMMA else tl.float64
    dgamma_acc = tl.zeros((BLOCK_N,), dtype=DGAMMA_ACC)
    if BLOCK_N2 > 0:
        dgamma_acc2 = tl.zeros((BLOCK_N2,), dtype=DGAMMA_ACC)
    for row in tl.range(pid, M, num_programs, num_stages=STAGES):  # a fixed order: deterministic
        row = tl.cast(row, tl.int64)  # int64 before any * stride
        x_row, dy_row = X + row * stride_x, DY + row * stride_dy
        dh_row, dx_row = DH + row * stride_dh, DX + row * stride_dx
        x = _load_row(x_row, cols, col_mask, ACC, "evict_last")
        dy = _load_row(dy_row, cols, col_mask, ACC, "evict_last")
        gamma = _load_gamma(GAMMA, cols, col_mask, ACC, WEIGHT_OFFSET)
        # Without SILU, u = dy * gamma needs no r: each piece's sum of u * x is taken as it is loaded,
        # which frees its registers before r's reduction (held across it, the row spilled).
        sum_sq = tl.sum(x * x, axis=0)
        if not SILU:
            sum_ux = tl.sum(dy * gamma * x, axis=0)
        if BLOCK_N2 > 0:
            x2 = _load_row(x_row, cols2, col_mask2, ACC, "evict_last")
            dy2 = _load_row(dy_row, cols2, col_mask2, ACC, "evict_last")
            gamma2 = _load_gamma(GAMMA, cols2, col_mask2, ACC, WEIGHT_OFFSET)
            sum_sq += tl.sum(x2 * x2, axis=0)
            if not SILU:
                sum_ux += tl.sum(dy2 * gamma2 * x2, axis=0)
        r = _inv_sqrt(sum_sq / N + tl.cast(eps, ACC), FP64)
        if SILU:  # u needs silu'(y), and y needs r
            _, _, u = _bwd_u(x, dy, gamma, r, X.dtype.element_ty, SILU, ROUND_NORM)
            sum_ux = tl.sum(u * x, axis=0)
            if BLOCK_N2 > 0:
                _, _, u2 = _bwd_u(x2, dy2, gamma2, r, X.dtype.element_ty, SILU, ROUND_NORM)
                sum_ux += tl.sum(u2 * x2, axis=0)
        c = r * r * r * (sum_ux / N)
        # The second reads' mask waits on r, so that the compiler cannot issue them before the sums and
        # hold both copies (r == r is false only for a NaN row: read as zeros, its dx and dgamma terms
        # are NaN still).
        row_n = tl.where(r == r, N, 0)
        x = _load_row(x_row, cols, cols < row_n, ACC, "evict_first")
        dy = _load_row(dy_row, cols, cols < row_n, ACC, "evict_first")
        gamma = _load_gamma(GAMMA, cols, col_mask, ACC, WEIGHT_OFFSET)
        n, dy, u = _bwd_u(x, dy, gamma, r, X.dtype.element_ty, SILU, ROUND_NORM)
        dx = r * u - x * c
        if HAS_DH:  # x was h = x + residual, which also went on: its own gradient joins
            dx += _load_row(dh_row, cols, col_mask, ACC, "")
        tl.store(dx_row + cols, _rounded(dx, DX.dtype.element_ty), mask=col_mask)
        dgamma_acc += (dy * n).to(DGAMMA_ACC)
        if BLOCK_N2 > 0:
            x2 = _load_row(x_row, cols2, cols2 < row_n, ACC, "evict_first")
            dy2 = _load_row(dy_row, cols2, cols2 < row_n, ACC, "evict_first")
            gamma2 = _load_gamma(GAMMA, cols2, col_mask2, ACC, WEIGHT_OFFSET)
            n2, dy2, u2 = _bwd_u(x2, dy2, gamma2, r, X.dtype.element_ty, SILU, ROUND_NORM)
            dx2 = r * u2 - x2 * c
            if HAS_DH:
                dx2 += _load_row(dh_row, cols2, col_mask2, ACC, "")
            tl.store(dx_row + cols2, _rounded(dx2, DX.dtype.element_ty), mask=col_mask2)
            dgamma_acc2 += (dy2 * n2).to(DGAMMA_ACC)
    partial_row = PARTIAL + pid.to(tl.int64) * N  # row pid of the (P, N) partials
    tl.store(partial_row + cols, dgamma_acc.to(tl.float64), mask=col_mask)
    if BLOCK_N2 > 0:
        tl.store(partial_row + cols2, dgamma_acc2.to(tl.float64), mask=col_mask2)


# --------------------------------------------------------------------------------------------------
# Rows walked in chunks: forward in two passes
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_fwd_chunked_kernel(
    X,
    RES,
    H,
    GAMMA,
    Y,
    N: tl.constexpr,
    stride_x,
    stride_res,
    stride_h,
    stride_y,
    eps,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN_N: tl.constexpr,
    VEC: tl.constexpr,
    SILU: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    RESIDUAL: tl.constexpr,
    FP64: tl.constexpr,
):
    ACC = tl.float64 if FP64 else tl.float32  # the compute dtype: float64 for float64 inputs
    # One program per row (a persistent loop over rows was slower: docs/design.md).
    # N is a compile-time constant here, one compiled kernel per row width: with the loops' trip count
    # and the last chunk's mask known, the compiler schedules the chunks better, and the chunk sizes of
    # the plans are fitted with N known (docs/design.md).
    stride_x, stride_y = stride_x // VEC * VEC, stride_y // VEC * VEC  # vector loads (N is known)
    stride_res, stride_h = stride_res // VEC * VEC, stride_h // VEC * VEC
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * stride_x
    h_row = H + row * stride_h  # the norm's input: x itself (H = X), or x + residual written in pass 1
    y_row = Y + row * stride_y
    # Pass 1: sum(x^2) over the row, chunk by chunk, in float32 lanes reduced once at the end. The loads
    # are marked evict_last so that the row stays in L2 for pass 2, which reads it again.
    # EVEN_N (N a multiple of BLOCK_N): no chunk is partial, so the loads need no mask.
    sum_sq = tl.zeros((BLOCK_N,), dtype=ACC)
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        if EVEN_N:
            x = tl.load(x_row + start + cols, eviction_policy="evict_last").to(ACC)
        else:
            x = tl.load(x_row + start + cols, mask=start + cols < N, other=0.0, eviction_policy="evict_last").to(ACC)
        if RESIDUAL:  # h = x + residual, stored in h's dtype for pass 2 and the caller, summed as stored
            in_row = start + cols < N
            x += tl.load(RES + row * stride_res + start + cols, mask=in_row, other=0.0).to(ACC)
            h = _rounded(x, H.dtype.element_ty)
            tl.store(h_row + start + cols, h, mask=in_row)
            x = h.to(ACC)
        sum_sq += x * x
    r = _inv_sqrt(tl.sum(sum_sq, axis=0) / N + tl.cast(eps, ACC), FP64)  # N, not the chunks' total width
    if RESIDUAL:
        tl.debug_barrier()  # pass 2 reads h back: every thread's stores of it first
    # Pass 2: y = x * r * gamma. This read of x is its last (evict_first); gamma is read by every row
    # (evict_last).
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        if EVEN_N:
            x = tl.load(h_row + start + cols, eviction_policy="evict_first").to(ACC)
            gamma = _scale(tl.load(GAMMA + start + cols, eviction_policy="evict_last").to(ACC), WEIGHT_OFFSET)
            n = x * r
            if ROUND_NORM:  # llama: n in the norm's input dtype before the weight multiplies it
                n = _rounded(n, H.dtype.element_ty).to(ACC)
            y = n * gamma
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(y_row + start + cols, _rounded(y, Y.dtype.element_ty))
        else:
            mask = start + cols < N
            x = tl.load(h_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(ACC)
            gamma = tl.load(GAMMA + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            gamma = _scale(gamma.to(ACC), WEIGHT_OFFSET)
            n = x * r
            if ROUND_NORM:
                n = _rounded(n, H.dtype.element_ty).to(ACC)
            y = n * gamma
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(y_row + start + cols, _rounded(y, Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# dgamma: the second pass over the (P, N) float64 partials
# --------------------------------------------------------------------------------------------------


@triton.jit
def _dgamma_column_sum_kernel(PARTIAL, DGAMMA, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FP64: tl.constexpr):
    ACC = tl.float64 if FP64 else tl.float32
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float64)
    for start in range(0, P, BLOCK_P):  # a fixed order of partial rows: deterministic, no atomics
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(PARTIAL + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
    # float64 to float32 first: one rounding step Triton lowers for every target, then gamma's dtype.
    tl.store(DGAMMA + cols, _rounded(tl.sum(acc, axis=0).to(ACC), DGAMMA.dtype.element_ty), mask=col_mask)
