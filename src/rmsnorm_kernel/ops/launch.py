"""Launch plans: how many programs, rows per tile, warps and pipeline stages each kernel gets.

A plan is a function of the problem (rows, N, element sizes, whether rows start on 16-byte boundaries)
and of the GPU (multiprocessors, shared memory per program). It follows from these rules:

1. Rows up to ``ROW_LIMIT`` lanes (BLOCK_N = next power of two of N) are held whole in registers; wider
   rows are walked in column chunks (the looped kernels).
2. Whole rows: a tile holds about ``TILE_ELEMENTS`` elements, so short rows share a tile; the forward
   gives each thread 16 to 32 elements (``tile // 512`` warps, 1 to 8); the backward holds x, dy and a
   float64 dgamma sum per element, so a single-row tile gets ``BLOCK_N // 256`` warps, up to 16.
3. The forward launches one program per tile. Rows off a 16-byte boundary are read element by element
   and need more loads in flight: 2 persistent programs per multiprocessor with a 2-stage pipeline.
   Aligned rows whose padded width (``BLOCK_N`` times the element size) is ``TWO_PASS_ROW_BYTES`` run
   the looped rows' two-pass forward, the whole row as one chunk over 8 warps: its second read of the
   row comes from L2, and it beat holding the row in registers by 3-5% at 16384x8192 (half precision)
   and 32768x4096 (float32). That covers every aligned half-precision N from 4097 to 8192 and float32
   from 2049 to 4096, which were not all measured (``benchmark-sweep`` has them).
4. The backward runs one persistent program per multiprocessor (each writes one row of float64 dgamma
   partials), with a 3-stage pipeline; a problem of at most ``SINGLE_PROGRAM_ELEMENTS`` elements runs
   as one program that writes dgamma itself (one launch fewer).
5. Pipeline stages are cut to what fits in shared memory.
6. Looped rows: the forward is one program per row over chunks of a quarter row (half a row at 65536),
   the backward's second step tiles of ``SEG_BLOCK_M`` x ``SEG_BLOCK_N`` over about 2 programs per
   multiprocessor.

Why each number is what it is, with the measurements, is in ``docs/performance-notes.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from .backend import CUDA, backend

ROW_LIMIT = 8192
TILE_ELEMENTS = 2048
MAX_ROWS_PER_TILE = 16
UNALIGNED_FWD_PROGRAMS_PER_SM = 2
UNALIGNED_FWD_STAGES = 2
TWO_PASS_ROW_BYTES = 16 * 1024
TWO_PASS_WARPS = 8
BWD_PROGRAMS_PER_SM = 1
BWD_STAGES = 3
SINGLE_PROGRAM_ELEMENTS = 65536
SINGLE_TILE_ELEMENTS = 4096
SINGLE_WARPS = 4
# Looped rows (N > ROW_LIMIT)
LOOP_FWD_MAX_CHUNK = 32768
LOOP_STAGES = 3
STATS_BLOCK_N = 8192
STATS_WARPS = 16
SEG_BLOCK_N = 2048
SEG_BLOCK_M = 2
SEG_WARPS = 8
SEG_PROGRAMS_PER_SM = 2
# dgamma's second pass over the (P, N) partials: narrow column blocks, many programs
SUM_BLOCK_P = 64
SUM_BLOCK_N = 32
SUM_WARPS = 4
# Stand-ins where no GPU reports its limits: the interpreter (a small GPU, quick on the CPU), and the
# shared memory of an H100/H200. DEFAULT_SMEM_BYTES: CUDA's default when the opt-in limit is missing.
INTERPRETER_SM_COUNT = 2
INTERPRETER_SMEM_BYTES = 227 * 1024
DEFAULT_SMEM_BYTES = 48 * 1024
# Shared memory left for Triton's own reduction scratch when sizing pipeline stages.
SMEM_RESERVE_BYTES = 8 * 1024


@dataclass(frozen=True)
class Plan:
    """How one problem is launched; the same plan for every call of that shape on one GPU."""

    #: Rows wider than ROW_LIMIT: the forward walks them in chunks, the backward takes two steps.
    looped: bool
    #: The forward runs the two-pass kernel, one program per row (looped rows, and rule 3's rows).
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
    #: Elements per vector load of x (VEC of the kernels): N and x's row stride and start are multiples.
    vec: int


@functools.lru_cache(maxsize=None)
def device_limits(device_index: int | None) -> tuple[int, int]:
    """(multiprocessors, shared memory one program may use) of a CUDA device by index (None or -1: the
    current one); the interpreter's stand-ins when the kernels do not run on a GPU."""
    if backend() != CUDA:
        return INTERPRETER_SM_COUNT, INTERPRETER_SMEM_BYTES
    index = device_index if device_index is not None and device_index >= 0 else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    # The opt-in limit is the one Triton launches against.
    return props.multi_processor_count, getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM_BYTES


def stages_that_fit(wanted: int, bytes_per_stage: int, smem_bytes: int) -> int:
    """The deepest pipeline up to ``wanted`` whose buffers fit: Triton keeps stages - 1 copies of one
    iteration's pipelined loads in shared memory."""
    return max(1, min(wanted, 1 + (smem_bytes - SMEM_RESERVE_BYTES) // max(1, bytes_per_stage)))


def whole_row_tile(block_n: int) -> tuple[int, int, int]:
    """Rule 2: (rows per tile, forward warps, backward warps) for rows of BLOCK_N lanes."""
    block_m = max(1, min(MAX_ROWS_PER_TILE, TILE_ELEMENTS // block_n))
    fwd_warps = max(1, min(8, block_m * block_n // 512))
    bwd_warps = fwd_warps if block_m > 1 else max(1, min(16, block_n // 256))
    return block_m, fwd_warps, bwd_warps


def looped_forward_chunk(block_n: int) -> tuple[int, int]:
    """Rule 6: (chunk, warps) of the looped forward; 32 warps from 32768 lanes on."""
    chunk = block_n // 2 if block_n >= 2 * LOOP_FWD_MAX_CHUNK else block_n // 4
    return min(chunk, LOOP_FWD_MAX_CHUNK), 16 if block_n <= 16384 else 32


def _forward(rows: int, n: int, sms: int, vec: int, x_bytes: int, gamma_bytes: int, smem: int) -> dict:
    aligned = vec * x_bytes == 16
    block_n = triton.next_power_of_2(n)
    if block_n > ROW_LIMIT:
        chunk, warps = looped_forward_chunk(block_n)
        return dict(looped=True, fwd_two_pass=True, block_n=chunk, fwd_block_m=1, fwd_warps=warps, fwd_programs=rows, fwd_stages=1)
    if aligned and block_n * x_bytes == TWO_PASS_ROW_BYTES:
        return dict(looped=False, fwd_two_pass=True, block_n=block_n, fwd_block_m=1, fwd_warps=TWO_PASS_WARPS,
                    fwd_programs=rows, fwd_stages=1)
    block_m, warps, _ = whole_row_tile(block_n)
    tiles = triton.cdiv(rows, block_m)
    if aligned:
        return dict(looped=False, fwd_two_pass=False, block_n=block_n, fwd_block_m=block_m, fwd_warps=warps,
                    fwd_programs=tiles, fwd_stages=1)
    programs = min(tiles, UNALIGNED_FWD_PROGRAMS_PER_SM * sms)
    # Pipelining needs a second tile to fetch: with one tile per program it only adds a prologue.
    stages = stages_that_fit(UNALIGNED_FWD_STAGES, block_m * block_n * x_bytes, smem) if programs < tiles else 1
    return dict(looped=False, fwd_two_pass=False, block_n=block_n, fwd_block_m=block_m, fwd_warps=warps,
                fwd_programs=programs, fwd_stages=stages)


def _backward(rows: int, n: int, sms: int, x_bytes: int, gamma_bytes: int, smem: int) -> dict:
    block_n = triton.next_power_of_2(n)
    if block_n > ROW_LIMIT:
        segments = triton.cdiv(n, SEG_BLOCK_N)
        programs = max(1, min(triton.cdiv(rows, SEG_BLOCK_M), SEG_PROGRAMS_PER_SM * sms // segments))
        # One depth for both steps: the one whose loads (row statistics: x, dy and gamma) take more room.
        per_stage = max(STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * SEG_BLOCK_M * SEG_BLOCK_N * x_bytes)
        return dict(bwd_block_m=SEG_BLOCK_M, bwd_block_n=SEG_BLOCK_N, bwd_warps=SEG_WARPS, partial_rows=programs,
                    bwd_grid=(programs, segments), bwd_stages=stages_that_fit(LOOP_STAGES, per_stage, smem),
                    stats_block_n=STATS_BLOCK_N, stats_warps=STATS_WARPS)
    if rows * block_n <= SINGLE_PROGRAM_ELEMENTS:
        block_m = min(triton.next_power_of_2(rows), max(1, SINGLE_TILE_ELEMENTS // block_n))
        stages = stages_that_fit(BWD_STAGES, 2 * block_m * block_n * x_bytes, smem) if rows > block_m else 1
        return dict(bwd_block_m=block_m, bwd_block_n=block_n, bwd_warps=max(1, min(SINGLE_WARPS, block_m * block_n // 32)),
                    partial_rows=0, bwd_grid=(1, 1), bwd_stages=stages, stats_block_n=0, stats_warps=0)
    block_m, _, warps = whole_row_tile(block_n)
    tiles = triton.cdiv(rows, block_m)
    programs = min(tiles, BWD_PROGRAMS_PER_SM * sms)
    stages = stages_that_fit(BWD_STAGES, 2 * block_m * block_n * x_bytes, smem) if programs < tiles else 1
    return dict(bwd_block_m=block_m, bwd_block_n=block_n, bwd_warps=warps, partial_rows=programs,
                bwd_grid=(programs, 1), bwd_stages=stages, stats_block_n=0, stats_warps=0)


@functools.lru_cache(maxsize=4096)
def plan(rows: int, n: int, sms: int, vec: int | None = None, x_bytes: int = 4, gamma_bytes: int = 4,
         smem: int = INTERPRETER_SMEM_BYTES) -> Plan:
    """The plan for ``rows`` rows of ``n`` elements on a GPU of ``sms`` multiprocessors and ``smem`` bytes
    of shared memory per program. ``vec``: elements per vector load of x (``vector_width``); None: rows
    on 16-byte boundaries if N allows it."""
    if vec is None:
        vec = vector_width_of(n, x_bytes)
    return Plan(**_forward(rows, n, sms, vec, x_bytes, gamma_bytes, smem),
                **_backward(rows, n, sms, x_bytes, gamma_bytes, smem), vec=vec)


def vector_width_of(n: int, element_size: int, *offsets: int) -> int:
    """The largest power of two, up to 16 bytes of elements, that divides N and each offset (in elements)."""
    g = functools.reduce(math.gcd, offsets, n)
    return min(16 // element_size, g & -g) if g else 16 // element_size


def vector_width(n: int, *views: torch.Tensor) -> int:
    """Elements one vector load can take from every row of each (rows, N) view: N, each view's row stride
    and its start (in elements) are multiples of it. The kernels pass it on to the compiler (VEC), which
    by itself only notices multiples of 16."""
    size = views[0].element_size()
    offsets = [v.data_ptr() // size if v.data_ptr() % size == 0 else 1 for v in views]
    offsets += [v.stride(0) for v in views if v.shape[0] > 1]
    return vector_width_of(n, size, *offsets)


def plan_for(x2: torch.Tensor, gamma: torch.Tensor) -> Plan:
    """The plan for the (rows, N) view ``x2`` and ``gamma`` on their GPU."""
    sms, smem = device_limits(x2.get_device())
    return plan(x2.shape[0], x2.shape[1], sms, vector_width(x2.shape[1], x2), x2.element_size(), gamma.element_size(), smem)
