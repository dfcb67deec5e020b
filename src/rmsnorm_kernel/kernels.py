"""Triton kernels for RMSNorm and the code that launches them.

Each kernel sits next to the formula it computes (see ``reference.py`` for the oracle):

    forward   r = 1 / sqrt(sum(x^2) / N + eps);  y = x * r * gamma
    backward  u = dy * gamma;  dx = r * u - x * r^3 * sum(u * x) / N
              dgamma = sum over rows of (dy * x * r)

Two shapes of kernel, chosen by the row length N:

- Whole rows (BLOCK_N = next_power_of_2(N) <= ROW_LIMIT): a program holds BLOCK_M complete rows in
  registers, so x and dy are read from memory once. The lanes past N are masked and read as 0: they add
  nothing to the sums, but they are not elements, so every mean divides by N, never by BLOCK_N.
- Looped rows (N > ROW_LIMIT, up to contract.MAX_N = 65536): a row does not fit in one program's
  registers, so the kernels walk it in column chunks of BLOCK_N. The forward reads each row twice (the
  sum of squares, then y), the second time from L2. That two-pass forward also measured faster than the
  whole-row one for aligned rows of 16 KiB (FWD_CHUNKED_ROWS), so it runs those too.

The backward recomputes r from the row of x it loads anyway rather than reading a saved copy: the
custom op returns y alone, and the recomputation costs arithmetic, not memory traffic.

The row-tile and column-chunk loops are ``tl.range`` loops with ``num_stages``: Triton then copies the
next tile into shared memory (cp.async) while the current one is computed, so a persistent program keeps
more bytes in flight than its registers hold. That, not arithmetic, is what the backward was short of.

dgamma is reduced without atomics, deterministically. The backward runs a fixed number P of persistent
programs (about one per multiprocessor); program p visits the row tiles p, p + P, p + 2P, ... in order and
keeps a float64 sum of its rows' dy * x * r in registers, written once at the end as row p of a (P, N)
float64 scratch. A second kernel sums that scratch per column in a fixed order. P depends only on the
problem's shape and the GPU's multiprocessor count, so the bits are the same run after run on the same
GPU, and the scratch is bounded by P * N * 8 bytes whatever the number of rows.

Rows are addressed through their row stride (the last dimension must be contiguous), so a slice such as
``x[:, :N]`` of a wider tensor is read in place. Row offsets are 64-bit: ``row * stride`` may pass 2**31.

The launchers assume arguments that passed ``contract.check_forward``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import CUDA, backend

try:  # Triton >= 3.3: the objects its own launch path uses (see _launch)
    from triton import knobs as _knobs
    from triton.runtime import driver as _driver
except ImportError:  # pragma: no cover - older Triton: always its own launcher
    _knobs = _driver = None

# --------------------------------------------------------------------------------------------------
# Whole rows: forward
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_fwd_kernel(
    X, GAMMA, Y, M, N, stride_x, stride_y, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    # BLOCK_M rows per tile: short rows share a tile so that each one moves enough bytes. Program p takes
    # the tiles p, p + P, ...: one tile each when the grid covers them all, several when it is persistent,
    # in which case STAGES > 1 lets Triton copy the next tile's x into shared memory (cp.async) while
    # this one is computed.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64: rows * stride may pass 2**31
        mask = (rows < M)[:, None] & col_mask[None, :]
        # Cast to float32 at load time, before the reduction: squares of float16/bfloat16 values lose
        # precision (and float16 overflows above 256^2) if summed in the input format.
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean_sq = tl.sum(x * x, axis=1) / N  # N, not BLOCK_N: masked lanes are padding, not data
        r = 1.0 / tl.sqrt(mean_sq + eps)
        y = x * r[:, None] * gamma[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Whole rows: backward (dx and the per-program dgamma partials in one pass over x and dy)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_bwd_kernel(
    DY, X, GAMMA, DX, DGAMMA_OUT, M, N, stride_dy, stride_x, stride_dx, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FINAL: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    # This program's share of dgamma, kept in registers across all its rows (no M x N scratch), in
    # float64: a float32 running sum over thousands of rows drifts by more than float32's tolerance
    # (seen at 32768 x 4096 on an H200); one float64 add per element costs no memory traffic.
    dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float64)
    # Persistent: tiles pid, pid + P, ... in a fixed order, so the sum is the same every run. With
    # STAGES > 1 the next tile's x and dy are copied into shared memory (cp.async) while this one is
    # computed: without it a multiprocessor has one tile in flight and waits on memory latency.
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64 before any * stride
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)  # the forward's r, same logical N
        u = dy * gamma[None, :]
        mean_ux = tl.sum(u * x, axis=1) / N  # N again: the padding lanes hold u * x = 0
        dx = r[:, None] * u - x * (r * r * r * mean_ux)[:, None]
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        # Masked rows and lanes hold dy = x = 0: they add nothing.
        dgamma_acc += tl.sum(dy * x * r[:, None], axis=0).to(tl.float64)
    if FINAL:  # the only program: this is dgamma itself, in gamma's dtype
        tl.store(DGAMMA_OUT + cols, dgamma_acc.to(tl.float32).to(DGAMMA_OUT.dtype.element_ty), mask=col_mask)
    else:  # row pid of the (P, N) float64 partials
        tl.store(DGAMMA_OUT + pid.to(tl.int64) * N + cols, dgamma_acc, mask=col_mask)


# --------------------------------------------------------------------------------------------------
# Looped rows (N > ROW_LIMIT), and the aligned rows of FWD_CHUNKED_ROWS: forward in two passes
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_fwd_chunked_kernel(
    X, GAMMA, Y, N, stride_x, stride_y, eps, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, EVEN_N: tl.constexpr,
):
    # One program per row. (A persistent loop over rows around the two passes measured 10-30% slower on
    # an H200 with the eviction hints below; docs/performance-notes.md, v4.)
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    # Pass 1: sum(x^2) over the row, chunk by chunk, in float32 lanes reduced once at the end. The loads
    # are marked evict_last so that the row stays in L2 for pass 2, which reads it again.
    # EVEN_N (N a multiple of BLOCK_N): no chunk is partial, so the loads need no mask.
    sum_sq = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        if EVEN_N:
            x = tl.load(x_row + start + cols, eviction_policy="evict_last").to(tl.float32)
        else:
            x = tl.load(x_row + start + cols, mask=start + cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sum_sq += x * x
    r = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / N + eps)  # N, not the chunks' total width
    # Pass 2: y = x * r * gamma. This read of x is its last (evict_first); gamma is read by every row
    # (evict_last).
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        if EVEN_N:
            x = tl.load(x_row + start + cols, eviction_policy="evict_first").to(tl.float32)
            gamma = tl.load(GAMMA + start + cols, eviction_policy="evict_last").to(tl.float32)
            tl.store(y_row + start + cols, (x * r * gamma).to(Y.dtype.element_ty))
        else:
            mask = start + cols < N
            x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            gamma = tl.load(GAMMA + start + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            tl.store(y_row + start + cols, (x * r * gamma).to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Looped rows: backward in two steps, because dx needs two whole-row sums before its first element
# --------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_bwd_row_stats_kernel(
    DY, X, GAMMA, RSTD, COEF, N, stride_dy, stride_x, eps, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    # Per row: r, and coef = r^3 * mean(u * x), the two numbers dx = r * u - x * coef needs.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    sum_sq = tl.zeros((BLOCK_N,), dtype=tl.float32)
    sum_ux = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        mask = start + cols < N
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + start + cols, mask=mask, other=0.0).to(tl.float32)
        gamma = tl.load(GAMMA + start + cols, mask=mask, other=0.0).to(tl.float32)
        sum_sq += x * x
        sum_ux += dy * gamma * x
    r = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / N + eps)
    tl.store(RSTD + row, r)
    tl.store(COEF + row, r * r * r * (tl.sum(sum_ux, axis=0) / N))


@triton.jit
def _rmsnorm_bwd_looped_kernel(
    DY, X, GAMMA, DX, PARTIAL, RSTD, COEF, M, N, stride_dy, stride_x, stride_dx,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    # Program (p, s): column segment s of the rows p, p + P, ...; its dgamma share stays in registers
    # because a segment, unlike a 65536-wide row, fits there.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    dgamma_acc = tl.zeros((BLOCK_N,), dtype=tl.float64)  # float64, as in _rmsnorm_bwd_kernel
    for tile in tl.range(pid, tl.cdiv(M, BLOCK_M), num_programs, num_stages=STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # int64 before any * stride
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        r = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        coef = tl.load(COEF + rows, mask=row_mask, other=0.0)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dx = r[:, None] * (dy * gamma[None, :]) - x * coef[:, None]
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dgamma_acc += tl.sum(dy * x * r[:, None], axis=0).to(tl.float64)
    tl.store(PARTIAL + pid.to(tl.int64) * N + cols, dgamma_acc, mask=col_mask)


# --------------------------------------------------------------------------------------------------
# dgamma: the second pass over the (P, N) float64 partials
# --------------------------------------------------------------------------------------------------


@triton.jit
def _dgamma_column_sum_kernel(PARTIAL, DGAMMA, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float64)
    for start in range(0, P, BLOCK_P):  # a fixed order of partial rows: deterministic, no atomics
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(PARTIAL + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
    # float64 to float32 first: one rounding step Triton lowers for every target, then gamma's dtype.
    tl.store(DGAMMA + cols, tl.sum(acc, axis=0).to(tl.float32).to(DGAMMA.dtype.element_ty), mask=col_mask)


# --------------------------------------------------------------------------------------------------
# Launch plans: block shapes, warps and the number of persistent programs, by size
# --------------------------------------------------------------------------------------------------

#: Widest row (BLOCK_N) held whole in registers. The backward keeps x, dy and a float64 dgamma
#: accumulator of that width per program; at 8192 lanes that fills a multiprocessor's register file, so
#: wider rows take the looped kernels. (A whole-row forward up to 32768 lanes, which fits, measured no
#: faster than the looped one on an H200: 160 against 164 us at 4096 x 32768 bfloat16.)
ROW_LIMIT = 8192

#: Whole rows, by BLOCK_N: (rows per tile, forward warps, backward warps). Rows shorter than 2048 lanes
#: are grouped so that a tile moves about 2048 elements. Forward warps give 16 to 32 elements per
#: thread. The backward holds more per element (x, dy, the float64 dgamma sum, and the next tiles in
#: shared memory), so it gets more warps. Measured on an H200 (docs/performance-notes.md, v3): at
#: 16384 x 8192 bfloat16 the backward at 16 warps (one program of 126 registers a thread per
#: multiprocessor) beats 32 warps (64 registers) by 15%, and the forward at 8 warps beats 16 by 2%.
WHOLE_ROW_TABLE: dict[int, tuple[int, int, int]] = {
    1: (16, 1, 1), 2: (16, 1, 1), 4: (16, 1, 1), 8: (16, 1, 1), 16: (16, 1, 1), 32: (16, 1, 1),
    64: (16, 2, 2), 128: (16, 4, 4), 256: (8, 4, 4), 512: (4, 4, 4), 1024: (2, 4, 4), 2048: (1, 4, 8),
    4096: (1, 8, 16), 8192: (1, 8, 16),
}
#: Aligned rows that the forward reads through the two-pass chunked kernel (the looped rows' kernel, one
#: program per row) rather than the whole-row one, by (BLOCK_N, bytes per element of x): (chunk, warps).
#: Rows of 16 KiB measured faster that way on an H200 (docs/performance-notes.md, v4): 32768 x 4096
#: float32 252 us (100% of the copy bandwidth) against 257 for two-row whole-row tiles, 16384 x 8192
#: bfloat16 128.5 against 131; the second read of x comes from L2. Keyed by BLOCK_N, an entry covers
#: N = 2049-4096 (float32) and 4097-8192 (half precision); only N = 4096 and 8192 were measured.
FWD_CHUNKED_ROWS: dict[tuple[int, int], tuple[int, int]] = {(4096, 4): (2048, 16), (8192, 2): (8192, 8)}
#: Whole-row forward programs per multiprocessor when it runs persistent (0: one program per row tile,
#: the grid covering every tile), for rows whose start is 16-byte aligned and for the others. Aligned
#: rows are read in 16-byte vectors and one program per tile measured best; unaligned ones (N = 4097 in
#: half precision) are read element by element, and persistent, pipelined programs measured 1.5 times
#: faster (8192 x 4097 float16 on an H200: 67.5 us against 102.7).
FWD_PROGRAMS_PER_SM = 0
UNALIGNED_FWD_PROGRAMS_PER_SM = 2
UNALIGNED_FWD_STAGES = 2
#: Pipelining depth of the row-tile and column-chunk loops (``tl.range(num_stages=...)``): with 2 or more,
#: Triton copies the next tile into shared memory with cp.async while the current one is computed, so a
#: multiprocessor keeps more bytes in flight than its registers hold. 1: no pipelining. Measured on an
#: H200 (fwd+bwd): 3 stages against none, 673 against 785 us at 32768 x 4096 float32 and 433 against
#: 566 us at 16384 x 8192 bfloat16; 2 stages were slower than none, 4 no faster than 3.
FWD_STAGES = 1
BWD_STAGES = 3
#: The looped backward's two steps (the looped forward has its own, LOOP_FWD_STAGES).
LOOP_STAGES = 3
#: Persistent whole-row backward programs per multiprocessor: the number of float64 dgamma partial rows
#: is this times the multiprocessor count. One, because the 4096- and 8192-lane backward programs fill a
#: multiprocessor's registers alone (16384 x 8192 bfloat16 on an H200: one 2.63 TB/s, two 2.27).
PROGRAMS_PER_SM = 1
#: Up to this many elements (rows * BLOCK_N) the backward runs as one program that writes dgamma itself:
#: one launch fewer, which matters more than GPU time for the small shapes whose cost is all host
#: overhead (0 turns this off). Its tiles hold SINGLE_TILE_ELEMENTS elements (or one row) over
#: SINGLE_WARPS warps: measured on an H200 at 128 x 257 float32, 25.5 us of GPU time against 86 for
#: 8192-element tiles over 16 warps (docs/performance-notes.md, v4).
SINGLE_PROGRAM_MAX_ELEMENTS = 65536
SINGLE_TILE_ELEMENTS = 4096
SINGLE_WARPS = 4

#: Looped forward, by BLOCK_N: (column chunk, warps), one program per row, at LOOP_FWD_STAGES. The row
#: must stay in L2 between the two passes, which the eviction hints in the kernel ask for. Measured on an
#: H200 (bfloat16, docs/performance-notes.md, v4): 32 warps and 8192-element chunks, unpipelined, read at
#: 95% of the copy bandwidth at N = 32768 (133 us) and 78% at N = 65536 (161 us), against 82% and 67% for
#: 8 warps with 3 pipeline stages and 79% and 71% for v3's 2 persistent programs per multiprocessor;
#: at N = 16384, 16 warps (142 us) beat 32 (150-176). At N = 65536, 32768-element chunks over 32 warps
#: read at 88% (144 us, v6), where 8192 and 16384 gave 78% and 77%; at N = 32768 the same chunk gave 82%.
LOOP_TABLE: dict[int, tuple[int, int]] = {16384: (4096, 16), 32768: (8192, 32), 65536: (32768, 32)}
LOOP_FWD_STAGES = 1
#: Looped backward, step 1 (row statistics, one program per row): chunk and warps. 16384 lanes at 32
#: warps would spill; 8192 at 16 does not.
STATS_BLOCK_N = 8192
STATS_WARPS = 16
#: Looped backward, step 2: tiles of SEG_BLOCK_M rows by SEG_BLOCK_N columns, a column segment per
#: program, about SEG_PROGRAMS_PER_SM * multiprocessors programs in all, rounded down so that they run
#: in one wave. 2 x 2048 measured best on an H200 (fwd+bwd at 4096 x 32768 bfloat16: 577 us against
#: 783 for 4 x 1024 and 1102 for 8 x 512).
SEG_BLOCK_N = 2048
SEG_BLOCK_M = 2
SEG_WARPS = 8
SEG_PROGRAMS_PER_SM = 2
#: The second pass's tile: narrow column blocks, so that the launch has enough programs to keep the
#: loads in flight (N = 4096 or 8192 over 132 partial rows on an H200: 9.5-10.6 us of GPU time against
#: 15.6-16.8 for 32 x 128 tiles, docs/performance-notes.md, v4).
SUM_BLOCK_P = 64
SUM_BLOCK_N = 32
#: The interpreter stands in for a GPU of this many multiprocessors (a few programs, quick on the CPU).
INTERPRETER_SM_COUNT = 2
#: Shared memory per program when the GPU does not report its opt-in limit (the CUDA default), and the
#: interpreter's stand-in (an H100/H200's limit).
DEFAULT_SMEM_BYTES = 48 * 1024
INTERPRETER_SMEM_BYTES = 227 * 1024
#: Shared memory left free for Triton's own reduction scratch when sizing the pipeline stages.
SMEM_RESERVE_BYTES = 8 * 1024


@functools.lru_cache(maxsize=None)
def _device_limits(device_index: int | None) -> tuple[int, int]:
    """(multiprocessors, shared memory one program may use) of a CUDA device, by index (None or -1: the
    current device); the interpreter's stand-ins when the kernels do not run on a GPU."""
    if backend() != CUDA:
        return INTERPRETER_SM_COUNT, INTERPRETER_SMEM_BYTES
    index = device_index if device_index is not None and device_index >= 0 else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    # The opt-in limit is the one Triton launches against.
    return props.multi_processor_count, getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM_BYTES


def _stages(wanted: int, bytes_per_stage: int, smem_bytes: int) -> int:
    """The deepest pipelining up to ``wanted`` whose buffers fit in shared memory. Triton keeps
    stages - 1 copies of one iteration's pipelined loads there (measured on sm_90: the looped forward at
    a 16384-element float32 chunk and 3 stages asks for 2 * 16384 * (4 + 4) bytes, x and gamma)."""
    return max(1, min(wanted, 1 + (smem_bytes - SMEM_RESERVE_BYTES) // max(1, bytes_per_stage)))


def sm_count(device: torch.device) -> int:
    """Multiprocessors of the GPU that holds ``device`` tensors (a fixed stand-in under the interpreter)."""
    return _device_limits(device.index if device.type == "cuda" else None)[0]


def block_size(n: int) -> int:
    return triton.next_power_of_2(n)


@dataclass(frozen=True)
class Plan:
    """How one (rows, N) problem is launched; the same plan for every call of that shape on one GPU."""

    #: Rows wider than ROW_LIMIT: the forward walks them in column chunks, the backward takes two steps.
    looped: bool
    #: The forward runs the two-pass chunked kernel, one program per row (all looped rows, and the
    #: aligned rows of FWD_CHUNKED_ROWS).
    fwd_chunked: bool
    #: Lanes per row (whole-row forward) or per chunk (chunked forward).
    block_n: int
    fwd_block_m: int
    fwd_warps: int
    #: Forward grid: one program per row tile, or fewer persistent ones that loop over the tiles.
    fwd_programs: int
    fwd_stages: int
    #: Tile of the backward's dx/dgamma kernel: BLOCK_M rows by BLOCK_N columns (a segment when looped).
    bwd_block_m: int
    bwd_block_n: int
    bwd_warps: int
    #: Persistent backward programs along the rows = rows of the float64 dgamma scratch (0: none, the
    #: single program writes dgamma directly).
    partial_rows: int
    #: Backward grid: (programs along rows, column segments).
    bwd_grid: tuple[int, int]
    bwd_stages: int


def _forward_plan(rows: int, n: int, sms: int, aligned: bool, x_bytes: int, gamma_bytes: int, smem: int) -> dict:
    block_n = block_size(n)
    if block_n <= ROW_LIMIT and not (aligned and (block_n, x_bytes) in FWD_CHUNKED_ROWS):
        block_m, warps, _ = WHOLE_ROW_TABLE[block_n]
        tiles = triton.cdiv(rows, block_m)
        per_sm, stages = (FWD_PROGRAMS_PER_SM, FWD_STAGES) if aligned else (UNALIGNED_FWD_PROGRAMS_PER_SM, UNALIGNED_FWD_STAGES)
        programs = min(tiles, per_sm * sms) if per_sm > 0 else tiles
        # Pipelining needs a second tile to fetch: with one tile per program it only adds a prologue
        # (128 x 257 float32 on an H200: 15 us of GPU time against 4).
        stages = _stages(stages, block_m * block_n * x_bytes, smem) if programs < tiles else 1
        return dict(looped=False, fwd_chunked=False, block_n=block_n, fwd_block_m=block_m, fwd_warps=warps,
                    fwd_programs=programs, fwd_stages=stages)
    if block_n <= ROW_LIMIT:
        chunk, warps = FWD_CHUNKED_ROWS[(block_n, x_bytes)]
        return dict(looped=False, fwd_chunked=True, block_n=chunk, fwd_block_m=1, fwd_warps=warps, fwd_programs=rows,
                    fwd_stages=1)
    chunk, warps = LOOP_TABLE[min(max(block_n, min(LOOP_TABLE)), max(LOOP_TABLE))]
    return dict(looped=True, fwd_chunked=True, block_n=chunk, fwd_block_m=1, fwd_warps=warps, fwd_programs=rows,
                fwd_stages=_stages(LOOP_FWD_STAGES, chunk * (x_bytes + gamma_bytes), smem))


def _backward_plan(rows: int, n: int, sms: int, x_bytes: int, gamma_bytes: int, smem: int) -> dict:
    block_n = block_size(n)
    if block_n <= ROW_LIMIT:
        block_m, _, warps = WHOLE_ROW_TABLE[block_n]
        if rows * block_n <= SINGLE_PROGRAM_MAX_ELEMENTS:
            block_m = min(triton.next_power_of_2(rows), max(1, SINGLE_TILE_ELEMENTS // block_n))
            return dict(bwd_block_m=block_m, bwd_block_n=block_n,
                        bwd_warps=max(1, min(SINGLE_WARPS, block_m * block_n // 32)), partial_rows=0, bwd_grid=(1, 1),
                        bwd_stages=_stages(BWD_STAGES, 2 * block_m * block_n * x_bytes, smem) if rows > block_m else 1)
        tiles = triton.cdiv(rows, block_m)
        programs = min(tiles, PROGRAMS_PER_SM * sms)
        return dict(bwd_block_m=block_m, bwd_block_n=block_n, bwd_warps=warps, partial_rows=programs,
                    bwd_grid=(programs, 1),
                    bwd_stages=_stages(BWD_STAGES, 2 * block_m * block_n * x_bytes, smem) if programs < tiles else 1)
    segments = triton.cdiv(n, SEG_BLOCK_N)
    programs = max(1, min(triton.cdiv(rows, SEG_BLOCK_M), SEG_PROGRAMS_PER_SM * sms // segments))
    # One depth for both steps, the one whose loads (row statistics: x, dy and gamma) take more room.
    stages = _stages(LOOP_STAGES, max(STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * SEG_BLOCK_M * SEG_BLOCK_N * x_bytes), smem)
    return dict(bwd_block_m=SEG_BLOCK_M, bwd_block_n=SEG_BLOCK_N, bwd_warps=SEG_WARPS,
                partial_rows=programs, bwd_grid=(programs, segments), bwd_stages=stages)


@functools.lru_cache(maxsize=4096)
def plan(rows: int, n: int, sms: int, aligned: bool = True, x_bytes: int = 4, gamma_bytes: int = 4,
         smem: int = INTERPRETER_SMEM_BYTES) -> Plan:
    """The launch plan for ``rows`` rows of ``n`` elements on a GPU with ``sms`` multiprocessors and
    ``smem`` bytes of shared memory per program. ``aligned``: every row of x starts on a 16-byte
    boundary; ``x_bytes``, ``gamma_bytes``: element sizes, which bound the pipeline stages."""
    return Plan(**_forward_plan(rows, n, sms, aligned, x_bytes, gamma_bytes, smem),
                **_backward_plan(rows, n, sms, x_bytes, gamma_bytes, smem))


def plan_for(x2: torch.Tensor, gamma: torch.Tensor) -> Plan:
    """The launch plan for the (rows, N) view ``x2`` and ``gamma`` on their GPU."""
    sms, smem = _device_limits(x2.get_device())
    return plan(x2.shape[0], x2.shape[1], sms, rows_aligned(x2), x2.element_size(), gamma.element_size(), smem)


def dgamma_scratch_rows(rows: int, n: int, device: torch.device) -> int:
    """Rows of the float64 (P, N) dgamma scratch the backward allocates for this problem."""
    return plan(rows, n, sm_count(device)).partial_rows


def max_dgamma_scratch_rows(n: int, device: torch.device) -> int:
    """The most scratch rows any number of rows can need at this N: the bound does not grow with M."""
    sms = sm_count(device)
    block_n = block_size(n)
    if block_n <= ROW_LIMIT:
        return PROGRAMS_PER_SM * sms
    return max(1, SEG_PROGRAMS_PER_SM * sms // triton.cdiv(n, SEG_BLOCK_N))


# --------------------------------------------------------------------------------------------------
# Launching: Triton's own launcher once per specialization, then the compiled kernel directly
# --------------------------------------------------------------------------------------------------

#: After the first launch of each specialization, launch the compiled kernel directly, as
#: torch.compile's generated code does, instead of going through Triton's per-call argument binding
#: and cache lookup (tens of microseconds a launch, most of a small RMSNorm's time). The calls are the
#: two lines Triton's own ``JITFunction.run`` ends with (Triton >= 3.3). Set the environment variable
#: RMSNORM_KERNEL_FAST_LAUNCH=0 to always launch through Triton's JIT.
FAST_LAUNCH = os.environ.get("RMSNORM_KERNEL_FAST_LAUNCH", "1") != "0" and _knobs is not None


@dataclass(frozen=True)
class Launched:
    """One launch as ``recording()`` saw it: Triton's compiled kernel, the grid, and every argument in
    the kernel's order (constexprs included)."""

    compiled: object
    grid: tuple
    args: tuple


_recorded: list[Launched] | None = None


@contextlib.contextmanager
def recording():
    """Collects the launches made through the fast launcher inside the block, in order (on the GPU,
    with FAST_LAUNCH on; nothing otherwise). ``native.py`` builds its recipes from them."""
    global _recorded
    outer, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = outer


def _launch(kernel, grid: tuple, args: tuple, constexprs: tuple, num_warps: int, key: tuple) -> None:
    """``kernel[grid](*args, **dict(constexprs), num_warps=num_warps)``, the constexprs last in the
    kernel's signature, in order.

    ``key`` stands for the arguments' part of Triton's specialization, which the caller builds from what
    it already has in hand: the tensors' device, dtypes and addresses modulo 16 (Triton
    specializes pointers on 16-byte alignment), and the integer arguments' values (finer than Triton's
    own "equal to 1, divisible by 16, fits in int32", so never coarser). A compiled kernel is reused only
    for the same key, constexprs and warps.
    """
    global FAST_LAUNCH
    if not (FAST_LAUNCH and _ON_GPU):
        kernel[grid](*args, **dict(constexprs), num_warps=num_warps)
        return
    cache = kernel.__dict__.get("_rmsnorm_compiled")  # kept on the kernel object: no hashing of it per call
    if cache is None:
        cache = kernel.__dict__["_rmsnorm_compiled"] = {}
    # Triton compiles and launches for the current device (the caller's ``torch.cuda.device``), whatever
    # device the tensors are on: so does this.
    device = _driver.active.get_current_device()
    full_key = (device, key, constexprs, num_warps)
    full = (*args, *(v for _, v in constexprs))
    compiled = cache.get(full_key)
    if compiled is not None:
        try:
            stream = _driver.active.get_current_stream(device)
            enter_hook = _knobs.runtime.launch_enter_hook
            # Triton's launch_metadata returns None unless a launch hook (a profiler) is installed.
            metadata = compiled.launch_metadata(grid, stream, *full) if enter_hook is not None else None
            compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, 1, stream, compiled.function, compiled.packed_metadata,
                         metadata, enter_hook, _knobs.runtime.launch_exit_hook, *full)
            if _recorded is not None:
                _recorded.append(Launched(compiled, grid, full))
            return
        except Exception:  # this Triton's compiled-kernel interface differs: its own launcher from now on
            FAST_LAUNCH = False
    compiled = kernel[grid](*args, **dict(constexprs), num_warps=num_warps)
    if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
        cache[full_key] = compiled
        if _recorded is not None:
            _recorded.append(Launched(compiled, grid, full))


def _address_key(*tensors: torch.Tensor) -> tuple:
    return tuple(t.data_ptr() % 16 for t in tensors)


_ON_GPU = backend() == CUDA


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(..., N) as a (rows, N) view with a unit column stride; a copy only when no such view exists."""
    t2 = t.view(-1, n) if t.dim() != 2 else t
    if t2.stride(1) != 1 and n != 1:
        t2 = t2.contiguous()
    return t2


def _rows_of_dy(dy: torch.Tensor, n: int) -> torch.Tensor:
    # Autograd may hand over any layout, e.g. a broadcast (stride-0) gradient from y.sum().
    try:
        return _rows(dy, n)
    except RuntimeError:  # leading dimensions that no single row stride describes
        return dy.reshape(-1, n).contiguous()


def rows_aligned(x2: torch.Tensor) -> bool:
    """Every row of the (rows, N) view ``x2`` starts on a 16-byte boundary (so it is read in vectors)."""
    return x2.data_ptr() % 16 == 0 and (x2.shape[0] == 1 or x2.stride(0) * x2.element_size() % 16 == 0)


def _empty_rows_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of x's shape and dtype (``empty_like`` is the cheaper call)."""
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def rmsnorm_forward(x: torch.Tensor, gamma: torch.Tensor, eps: float, p: Plan | None = None) -> torch.Tensor:
    """y = rmsnorm(x) * gamma in x's dtype, contiguous, for x of shape (..., N) with rows at one stride."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    rows = x2.shape[0]
    y = _empty_rows_like(x)
    stride = x2.stride(0)
    key = (x.get_device(), x.dtype, gamma.dtype, rows, n, stride, *_address_key(x2, gamma, y))
    p = p or plan_for(x2, gamma)
    if p.fwd_chunked:
        _launch(_rmsnorm_fwd_chunked_kernel, (p.fwd_programs,), (x2, gamma, y, n, stride, n, eps),
                (("BLOCK_N", p.block_n), ("STAGES", p.fwd_stages), ("EVEN_N", n % p.block_n == 0)), p.fwd_warps, key)
    else:
        _launch(_rmsnorm_fwd_kernel, (p.fwd_programs,), (x2, gamma, y, rows, n, stride, n, eps),
                (("BLOCK_M", p.fwd_block_m), ("BLOCK_N", p.block_n), ("STAGES", p.fwd_stages)), p.fwd_warps, key)
    return y


def rmsnorm_backward(
    dy: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, eps: float, p: Plan | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dgamma in gamma's dtype) for dy and x of the same shape (..., N)."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    dy2 = _rows_of_dy(dy, n)
    rows = x2.shape[0]
    dx = _empty_rows_like(x)
    dgamma = torch.empty_like(gamma)
    p = p or plan_for(x2, gamma)
    sdy, sx = dy2.stride(0), x2.stride(0)
    if p.looped:
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        coef = torch.empty(rows, dtype=torch.float32, device=x.device)
        partial = torch.empty((p.partial_rows, n), dtype=torch.float64, device=x.device)
        key = (x.get_device(), dy2.dtype, x.dtype, gamma.dtype, rows, n, sdy, sx,
               *_address_key(dy2, x2, gamma, dx, partial, rstd, coef))
        _launch(_rmsnorm_bwd_row_stats_kernel, (rows,), (dy2, x2, gamma, rstd, coef, n, sdy, sx, eps),
                (("BLOCK_N", STATS_BLOCK_N), ("STAGES", p.bwd_stages)), STATS_WARPS, key)
        _launch(_rmsnorm_bwd_looped_kernel, p.bwd_grid,
                (dy2, x2, gamma, dx, partial, rstd, coef, rows, n, sdy, sx, n),
                (("BLOCK_M", p.bwd_block_m), ("BLOCK_N", p.bwd_block_n), ("STAGES", p.bwd_stages)), p.bwd_warps, key)
    else:
        final = p.partial_rows == 0
        partial = dgamma if final else torch.empty((p.partial_rows, n), dtype=torch.float64, device=x.device)
        key = (x.get_device(), dy2.dtype, x.dtype, gamma.dtype, rows, n, sdy, sx, *_address_key(dy2, x2, gamma, dx, partial))
        _launch(_rmsnorm_bwd_kernel, p.bwd_grid[:1], (dy2, x2, gamma, dx, partial, rows, n, sdy, sx, n, eps),
                (("BLOCK_M", p.bwd_block_m), ("BLOCK_N", p.bwd_block_n), ("FINAL", final), ("STAGES", p.bwd_stages)),
                p.bwd_warps, key)
        if final:
            return dx, dgamma
    _launch(_dgamma_column_sum_kernel, (triton.cdiv(n, SUM_BLOCK_N),), (partial, dgamma, p.partial_rows, n),
            (("BLOCK_P", SUM_BLOCK_P), ("BLOCK_N", SUM_BLOCK_N)), 4,
            (x.get_device(), gamma.dtype, p.partial_rows, n, *_address_key(partial, dgamma)))
    return dx, dgamma
