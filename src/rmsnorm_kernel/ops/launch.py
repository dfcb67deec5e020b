"""Launch plans: how many programs, rows per tile, warps, chunks and pipeline stages each kernel gets.

A plan is a function of the problem (rows, N, element sizes, how wide a vector load the rows allow) and
of the GPU (multiprocessors, shared memory, L2 size, threads per multiprocessor), by these rules:

1. Forward, three ways, by N:
   a. Whole rows in registers, several rows a tile (about ``TILE_ELEMENTS`` elements, ``tile // 512``
      warps): N a power of two up to ``ROW_LIMIT``, where BLOCK_N = N wastes no lane, and any N up to
      ``WHOLE_ROW_FWD_LIMIT``, where a row is short. Rows that cannot be read in 16-byte vectors (N, the
      row stride or the start not a multiple of 16 bytes) take this kernel at every BLOCK_N up to
      ``ROW_LIMIT``, as persistent programs (2 a multiprocessor, 2 stages), because narrow loads need
      more of them in flight. Aligned rows of exactly 16 KiB (half precision 8192, float32 4096) take
      1b's kernel as one chunk of 8 warps.
   b. Two passes over the row in chunks, one program a row, the second pass from L2: every other N,
      when its rows are read in 16-byte vectors and its rows in flight fit in ``L2_SHARE`` of L2. The
      warps are the fewest of 4, 8, 16 that keep (programs a multiprocessor can hold) x
      (multiprocessors) x (row bytes) within that share; each thread takes 4 elements of a chunk. More
      programs keep more loads in flight while rows are short; longer rows need fewer of them, or their
      second read misses L2.
   c. Every other row above ``ROW_LIMIT`` (powers of two, rows 1b cannot take): the same kernel over
      quarter-row chunks (half a row at 65536), 16 warps up to 16384 lanes, 32 above. Below
      ``ROW_LIMIT``, a row 1b cannot take keeps whole rows (1a): on a GPU whose L2 is small.
2. Backward, whole rows (BLOCK_N up to ``ROW_LIMIT``): one persistent program a multiprocessor (each
   writes one row of float64 dgamma partials). A tile holds ``BWD_TILE_BYTES`` of x (at most
   ``MAX_ROWS_PER_TILE`` rows); its warps span one row with one 16-byte vector a thread, up to 8, so
   that the per-column dgamma sum over the tile's rows stays inside each thread. ``BWD_STAGES`` stages
   of cp.async copies keep the next tiles in flight. A problem of at most ``SINGLE_PROGRAM_ELEMENTS``
   elements runs as one program that writes dgamma itself (one launch fewer).
3. Backward, longer rows: per-row statistics in chunks of ``STATS_BLOCK_N`` over ``STATS_WARPS`` warps,
   then dx and the partials in tiles of ``SEG_BLOCK_M`` x ``SEG_BLOCK_N`` over about 2 programs a
   multiprocessor.
4. Pipeline stages are cut to what fits in shared memory.

The rules were fitted on hidden sizes that are multiples of 1024; ``benchmark-sweep`` reports them on
the others. Why each number is what it is, with the measurements, is in ``docs/performance-notes.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from .backend import CUDA, backend

ROW_LIMIT = 8192
WHOLE_ROW_FWD_LIMIT = 2048
TILE_ELEMENTS = 2048
MAX_ROWS_PER_TILE = 16
UNALIGNED_FWD_PROGRAMS_PER_SM = 2
UNALIGNED_FWD_STAGES = 2
TWO_PASS_ROW_BYTES = 16 * 1024
TWO_PASS_WARPS = 8
# Rule 1b: the share of L2 the rows in flight may take, the warps tried, and elements a thread per chunk.
L2_SHARE = 0.4
CHUNKED_FWD_WARPS = (4, 8, 16)
CHUNK_ELEMENTS_PER_THREAD = 4
BWD_TILE_BYTES = 16 * 1024
BWD_MAX_WARPS = 8
BWD_PROGRAMS_PER_SM = 1
BWD_STAGES = 4
SINGLE_PROGRAM_ELEMENTS = 65536
SINGLE_TILE_ELEMENTS = 4096
SINGLE_WARPS = 4
# Looped rows (N > ROW_LIMIT)
LOOP_FWD_MAX_CHUNK = 32768
LOOP_STAGES = 3
STATS_BLOCK_N = 2048
STATS_WARPS = 4
SEG_BLOCK_N = 2048
SEG_BLOCK_M = 2
SEG_WARPS = 8
SEG_PROGRAMS_PER_SM = 2
# dgamma's second pass over the (P, N) partials: narrow column blocks, many programs
SUM_BLOCK_P = 64
SUM_BLOCK_N = 32
SUM_WARPS = 4
# Shared memory left for Triton's own reduction scratch when sizing pipeline stages.
SMEM_RESERVE_BYTES = 8 * 1024
# CUDA's default shared memory per block when the opt-in limit is missing.
DEFAULT_SMEM_BYTES = 48 * 1024


@dataclass(frozen=True)
class Gpu:
    """The limits of a GPU that the plans depend on."""

    sms: int
    #: Shared memory one program may use (the opt-in limit, the one Triton launches against).
    smem_bytes: int
    l2_bytes: int
    threads_per_sm: int


#: An H200 (and H100): the limits the plans were fitted on.
H200 = Gpu(sms=132, smem_bytes=227 * 1024, l2_bytes=60 * 1024 * 1024, threads_per_sm=2048)
#: The interpreter's stand-in: an H200 of 2 multiprocessors, so that persistent grids stay small on the CPU.
INTERPRETER_GPU = Gpu(sms=2, smem_bytes=H200.smem_bytes, l2_bytes=H200.l2_bytes, threads_per_sm=H200.threads_per_sm)


@dataclass(frozen=True)
class Plan:
    """How one problem is launched; the same plan for every call of that shape, vector width and GPU.
    The launchers take VEC from the tensors they are given, not from ``vec``."""

    #: Rows wider than ROW_LIMIT: the forward walks them in chunks, the backward takes two steps.
    looped: bool
    #: The forward runs the two-pass kernel, one program per row (rules 1b and 1c, and 16 KiB rows).
    fwd_two_pass: bool
    #: Lanes per row (whole-row forward) or per chunk (two-pass forward).
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
    #: Rows of the float64 dgamma partials = persistent backward programs along the rows (0: none, the
    #: single program writes dgamma itself). Bounded by the GPU, never by the number of rows.
    partial_rows: int
    #: Backward grid: (programs along rows, column segments).
    bwd_grid: tuple[int, int]
    bwd_stages: int
    #: Looped rows: the backward's row statistics walk each row in chunks of this many lanes.
    stats_block_n: int
    stats_warps: int
    #: Elements per vector load of the x the plan was made for (``vector_width``); it chooses the rules.
    vec: int


@functools.cache
def gpu_limits(device_index: int | None) -> Gpu:
    """The limits of a CUDA device by index (None or -1: the current one); the interpreter's stand-in
    when the kernels do not run on a GPU."""
    if backend() != CUDA:
        return INTERPRETER_GPU
    index = device_index if device_index is not None and device_index >= 0 else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return Gpu(
        sms=props.multi_processor_count,
        smem_bytes=getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM_BYTES,
        l2_bytes=props.L2_cache_size,
        threads_per_sm=props.max_threads_per_multi_processor,
    )


def stages_that_fit(wanted: int, bytes_per_stage: int, smem_bytes: int) -> int:
    """The deepest pipeline up to ``wanted`` whose buffers fit: Triton keeps stages - 1 copies of one
    iteration's pipelined loads in shared memory."""
    return max(1, min(wanted, 1 + (smem_bytes - SMEM_RESERVE_BYTES) // max(1, bytes_per_stage)))


def whole_row_tile(block_n: int) -> tuple[int, int]:
    """Rule 1a: (rows per tile, warps) of the whole-row forward for rows of BLOCK_N lanes."""
    block_m = max(1, min(MAX_ROWS_PER_TILE, TILE_ELEMENTS // block_n))
    return block_m, max(1, min(8, block_m * block_n // 512))


def chunked_forward(n: int, x_bytes: int, gpu: Gpu) -> tuple[int, int] | None:
    """Rule 1b: (chunk, warps) of the two-pass forward, or None when no warp count keeps the rows in
    flight (one per program a multiprocessor holds) within ``L2_SHARE`` of L2."""
    for warps in CHUNKED_FWD_WARPS:
        programs_per_sm = gpu.threads_per_sm // (32 * warps)
        if programs_per_sm * gpu.sms * n * x_bytes <= L2_SHARE * gpu.l2_bytes:
            return CHUNK_ELEMENTS_PER_THREAD * 32 * warps, warps
    return None


def looped_forward_chunk(block_n: int) -> tuple[int, int]:
    """Rule 1c: (chunk, warps) of the looped forward; 32 warps from 32768 lanes on."""
    chunk = block_n // 2 if block_n >= 2 * LOOP_FWD_MAX_CHUNK else block_n // 4
    return min(chunk, LOOP_FWD_MAX_CHUNK), 16 if block_n <= 16384 else 32


def backward_tile(block_n: int, x_bytes: int) -> tuple[int, int]:
    """Rule 2: (rows per tile, warps) of the whole-row backward for rows of BLOCK_N lanes."""
    block_m = max(1, min(MAX_ROWS_PER_TILE, BWD_TILE_BYTES // (block_n * x_bytes)))
    return block_m, max(1, min(BWD_MAX_WARPS, block_n * x_bytes // (16 * 32)))


def _forward(rows: int, n: int, gpu: Gpu, vec: int, x_bytes: int) -> dict:
    aligned = vec * x_bytes == 16
    block_n = triton.next_power_of_2(n)
    two_pass = dict(fwd_two_pass=True, fwd_block_m=1, fwd_programs=rows, fwd_stages=1)
    if block_n <= ROW_LIMIT and aligned and block_n * x_bytes == TWO_PASS_ROW_BYTES and block_n == n:
        return dict(looped=False, block_n=block_n, fwd_warps=TWO_PASS_WARPS, **two_pass)
    if aligned and block_n != n and n > WHOLE_ROW_FWD_LIMIT and (chunked := chunked_forward(n, x_bytes, gpu)):
        chunk, warps = chunked
        return dict(looped=block_n > ROW_LIMIT, block_n=chunk, fwd_warps=warps, **two_pass)
    if block_n > ROW_LIMIT:
        chunk, warps = looped_forward_chunk(block_n)
        return dict(looped=True, block_n=chunk, fwd_warps=warps, **two_pass)
    block_m, warps = whole_row_tile(block_n)
    tiles = triton.cdiv(rows, block_m)
    if aligned:
        return dict(
            looped=False,
            fwd_two_pass=False,
            block_n=block_n,
            fwd_block_m=block_m,
            fwd_warps=warps,
            fwd_programs=tiles,
            fwd_stages=1,
        )
    programs = min(tiles, UNALIGNED_FWD_PROGRAMS_PER_SM * gpu.sms)
    # Pipelining needs a second tile to fetch: with one tile per program it only adds a prologue.
    stages = (
        stages_that_fit(UNALIGNED_FWD_STAGES, block_m * block_n * x_bytes, gpu.smem_bytes) if programs < tiles else 1
    )
    return dict(
        looped=False,
        fwd_two_pass=False,
        block_n=block_n,
        fwd_block_m=block_m,
        fwd_warps=warps,
        fwd_programs=programs,
        fwd_stages=stages,
    )


def _backward(rows: int, n: int, gpu: Gpu, x_bytes: int, gamma_bytes: int) -> dict:
    block_n = triton.next_power_of_2(n)
    if block_n > ROW_LIMIT:
        segments = triton.cdiv(n, SEG_BLOCK_N)
        programs = max(1, min(triton.cdiv(rows, SEG_BLOCK_M), SEG_PROGRAMS_PER_SM * gpu.sms // segments))
        # One depth for both steps: the one whose loads (row statistics: x, dy and gamma) take more room.
        per_stage = max(STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * SEG_BLOCK_M * SEG_BLOCK_N * x_bytes)
        return dict(
            bwd_block_m=SEG_BLOCK_M,
            bwd_block_n=SEG_BLOCK_N,
            bwd_warps=SEG_WARPS,
            partial_rows=programs,
            bwd_grid=(programs, segments),
            bwd_stages=stages_that_fit(LOOP_STAGES, per_stage, gpu.smem_bytes),
            stats_block_n=STATS_BLOCK_N,
            stats_warps=STATS_WARPS,
        )
    no_stats = dict(stats_block_n=0, stats_warps=0)
    if rows * block_n <= SINGLE_PROGRAM_ELEMENTS:
        block_m = min(triton.next_power_of_2(rows), max(1, SINGLE_TILE_ELEMENTS // block_n))
        stages = stages_that_fit(BWD_STAGES, 2 * block_m * block_n * x_bytes, gpu.smem_bytes) if rows > block_m else 1
        return dict(
            bwd_block_m=block_m,
            bwd_block_n=block_n,
            bwd_warps=max(1, min(SINGLE_WARPS, block_m * block_n // 32)),
            partial_rows=0,
            bwd_grid=(1, 1),
            bwd_stages=stages,
            **no_stats,
        )
    block_m, warps = backward_tile(block_n, x_bytes)
    tiles = triton.cdiv(rows, block_m)
    programs = min(tiles, BWD_PROGRAMS_PER_SM * gpu.sms)
    stages = stages_that_fit(BWD_STAGES, 2 * block_m * block_n * x_bytes, gpu.smem_bytes) if programs < tiles else 1
    return dict(
        bwd_block_m=block_m,
        bwd_block_n=block_n,
        bwd_warps=warps,
        partial_rows=programs,
        bwd_grid=(programs, 1),
        bwd_stages=stages,
        **no_stats,
    )


@functools.lru_cache(maxsize=4096)
def plan(
    rows: int, n: int, gpu: Gpu = INTERPRETER_GPU, vec: int | None = None, x_bytes: int = 4, gamma_bytes: int = 4
) -> Plan:
    """The plan for ``rows`` rows of ``n`` elements of ``x_bytes`` bytes on ``gpu``. ``vec``: elements per
    vector load of x (``vector_width``); None: as many as 16 bytes and N allow (rows that start on
    16-byte boundaries)."""
    if vec is None:
        vec = min(16 // x_bytes, n & -n)
    return Plan(**_forward(rows, n, gpu, vec, x_bytes), **_backward(rows, n, gpu, x_bytes, gamma_bytes), vec=vec)


def vector_width(n: int, *views: torch.Tensor) -> int:
    """Elements one vector load can take from every row of each (rows, N) view: N, each view's row stride
    and its start (in elements) are multiples of it. The kernels pass it on to the compiler (VEC), which
    by itself only notices multiples of 16. Called on every launch, so kept to a few integer operations."""
    size = views[0].element_size()
    g = n
    for v in views:
        ptr = v.data_ptr()
        g = math.gcd(g, ptr // size if ptr % size == 0 else 1, v.stride(0) if v.shape[0] > 1 else 0)
    return min(16 // size, g & -g)


def plan_for(x2: torch.Tensor, gamma: torch.Tensor, vec: int | None = None) -> Plan:
    """The plan for the (rows, N) view ``x2`` and ``gamma`` on their GPU; ``vec``: ``vector_width`` of
    ``x2`` when the caller has it already."""
    n = x2.shape[1]
    vec = vector_width(n, x2) if vec is None else vec
    return plan(x2.shape[0], n, gpu_limits(x2.get_device()), vec, x2.element_size(), gamma.element_size())
