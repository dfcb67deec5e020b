"""Launch plans: the grid, tile, warps and pipeline depth each kernel of ``kernels.py`` runs with.

The rules are the code below, in this order:

- ``Gpu``: the limits a plan reads (multiprocessors, shared memory, L2, threads per multiprocessor).
  ``INTERPRETER`` is the record Triton's interpreter plans with; ``H200`` a record for planning without
  one.
- ``plan(rows, n, gpu, ...)`` joins the forward's and the backward's settings, cached per (shape, vector
  width, GPU, residual). It takes the GPU from its caller, always.
- ``_forward`` picks one of ``FORWARD_BRANCHES`` from N, the element size, whether rows are read in
  16-byte vectors, whether a residual is added and whether their rows in flight fit the GPU's L2
  (``chunked_forward``); the tile comes from ``whole_row_tile``, ``chunked_forward`` or
  ``looped_forward_chunk``. Rows read without 16-byte vectors take chunks past ``ROW_LIMIT``
  (``UNALIGNED_CHUNK_WARPS``), and otherwise a persistent grid sized by the multiprocessors.
- ``_backward`` picks one of ``BACKWARD_BRANCHES`` from N: rows wider than ``ROW_LIMIT`` take two
  steps, or, where ``reread_rows`` says so, whole rows one at a time, read twice; a whole row is one
  power-of-two piece of lanes, or two (``row_pieces``) for narrow rows and rows off 16 bytes, which both
  run on the narrow rows' settings; the tile comes from ``backward_tile``, smaller for problems of few
  rows; those 16-bit rows sum dgamma per tile element when programs take several tiles; its persistent
  grid, sized by the multiprocessors alone, is also the number of rows of dgamma partials.
- ``stages_that_fit`` cuts every pipeline to the GPU's shared memory.
- ``vector_width`` and ``plan_for``: the plan for the tensors at hand, on their device's GPU.

Why each number is what it is, with the measurements behind it: ``docs/design.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

# Forward
ROW_LIMIT = 8192
WHOLE_ROW_FWD_LIMIT = 2048
TILE_ELEMENTS = 2048
MAX_ROWS_PER_TILE = 16
# Lanes a thread takes in a whole-row forward tile read in 16-byte vectors: rows of at least
# WIDE_TILE_ROW_LANES lanes, and the narrower ones
FWD_LANES_PER_THREAD = 64
NARROW_FWD_LANES_PER_THREAD = 16
WIDE_TILE_ROW_LANES = 512
# With a residual a lane loads two elements and stores two: at least this many warps a tile
RESIDUAL_MIN_WARPS = 4
UNALIGNED_FWD_PROGRAMS_PER_SM = 2
UNALIGNED_FWD_STAGES = 2
# Rows of exactly TWO_PASS_ROW_BYTES, a power of two (bfloat16 8192, float32 4096): the two-pass forward
# on TWO_PASS_WARPS, in chunks of at most WIDE_FWD_CHUNK lanes
TWO_PASS_ROW_BYTES = 16 * 1024
TWO_PASS_WARPS = 16
# The two-pass forward's warps: the fewest of CHUNKED_FWD_WARPS whose rows in flight fit L2_SHARE of L2
L2_SHARE = 0.28
CHUNKED_FWD_WARPS = (4, 8, 16)
CHUNK_ELEMENTS_PER_THREAD = 4
# Rows wider than WIDE_FWD_CHUNK take chunks of that many lanes whatever the warps (fewer, longer steps
# along the row, whose count the kernel knows at compile time)
WIDE_FWD_CHUNK = 4096
# Rows off a 16-byte boundary wider than ROW_LIMIT: chunks of CHUNK_ELEMENTS_PER_THREAD lanes a thread on
# UNALIGNED_CHUNK_WARPS[x_bytes] warps (loads narrower than 16 bytes: wider chunks held more registers
# than the bytes in flight they added were worth)
UNALIGNED_CHUNK_WARPS = {2: 8, 4: 16, 8: 16}
LOOP_FWD_MAX_CHUNK = 32768
PADDED_LOOP_FWD_MAX_CHUNK = 8192
# With a residual, rows past ROW_LIMIT of up to this many lanes, mostly data (N > 3/4 of the lanes), take
# one pass over whole rows: the two-pass forward would read back the h it has just written.
RESIDUAL_ROW_LIMIT = 16384
RESIDUAL_WIDE_WARPS = 16
# Backward, whole rows
BWD_TILE_BYTES = 16 * 1024
BWD_MAX_WARPS = 8
BWD_PROGRAMS_PER_SM = 1
BWD_STAGES = 4
# Backward, narrow rows (x's rows of at most NARROW_ROW_BYTES): occupancy set by the GPU, not by N; tiles
# of BWD_TILE_BYTES of x, and for 16-bit x whose programs take several tiles, dgamma summed per (row,
# column) of the tile, with tiles of BWD_TILE_BYTES of x as computed (float32)
NARROW_ROW_BYTES = 2048
NARROW_MAX_ROWS_PER_TILE = 128
NARROW_WARPS = 4
NARROW_PROGRAMS_PER_SM = 2
NARROW_STAGES = 3
# Backward, small problems: tiles shrink until there are at least this many a multiprocessor
BWD_MIN_TILES_PER_SM = 0.5
# Backward, rows longer than ROW_LIMIT whose pieces (row_pieces) are at most REREAD_MAX_LANES lanes and
# hold at most REREAD_MAX_ROW_BYTES of x: whole rows, one a program at a time, x and dy read twice (the
# second time from cache), on the (warps, programs a multiprocessor, stages) of the first row of
# REREAD_SETTINGS whose bytes the pieces do not pass, as deep as fits; where two programs' stages do not
# fit a multiprocessor, one program of their warps. The others, and rows off 16 bytes: two steps.
REREAD_MAX_LANES = 16384
REREAD_MAX_ROW_BYTES = 48 * 1024
REREAD_SETTINGS = (
    (24 * 1024, 8, 2, 2),  # 16-bit rows in two pieces: 8193-12288
    (32 * 1024, 32, 1, 1),  # 16-bit rows of 12289-16384
    (REREAD_MAX_ROW_BYTES, 16, 1, 2),  # float32 rows of 8193-12288
)
LOOP_STAGES = 3
STATS_BLOCK_N = 2048
STATS_WARPS = 4
SEG_BLOCK_N = 2048
SEG_BLOCK_M = 2
SEG_WARPS = 8
SEG_PROGRAMS_PER_SM = 2
# dgamma's second pass over the (P, N) partials
SUM_BLOCK_P = 64
SUM_BLOCK_N = 32
# Under Triton's interpreter programs run one after another, each at a large fixed cost: fewer, wider ones
INTERPRETER_SUM_BLOCK_N = 1024
SUM_WARPS = 4
# Shared memory left for Triton's own reduction scratch when sizing pipeline stages.
SMEM_RESERVE_BYTES = 8 * 1024
# CUDA's default shared memory per block when the opt-in limit is missing.
DEFAULT_SMEM_BYTES = 48 * 1024

#: The forward's branches, in the order ``_forward`` tries them.
FORWARD_BRANCHES = (
    "residual_wide_rows",
    "rows_of_16k",
    "chunks",
    "unaligned_chunks",
    "quarter_chunks",
    "whole_rows",
    "whole_rows_persistent",
)
#: The backward's branches, in the order ``_backward`` tries them.
BACKWARD_BRANCHES = ("looped", "reread_rows", "whole_rows")


@dataclass(frozen=True)
class Gpu:
    """The limits of a GPU that the plans depend on."""

    sms: int
    #: Shared memory one program may use (the opt-in limit, the one Triton launches against).
    smem_bytes: int
    l2_bytes: int
    threads_per_sm: int


#: An H200 (an H100 has the same limits): for tests and benchmarks that plan for a GPU they do not run on.
H200 = Gpu(sms=132, smem_bytes=227 * 1024, l2_bytes=60 * 1024 * 1024, threads_per_sm=2048)
#: What plans for Triton's interpreter (CPU tensors) are made with: an H200 of 2 multiprocessors. The
#: interpreter runs programs one after another, each at a large fixed cost, so persistent grids (a program
#: or two a multiprocessor) stay at a few programs; the other limits only choose tiles, which the
#: interpreter runs at any size.
INTERPRETER = Gpu(sms=2, smem_bytes=H200.smem_bytes, l2_bytes=H200.l2_bytes, threads_per_sm=H200.threads_per_sm)


@dataclass(frozen=True)
class Plan:
    """How one problem is launched; the same plan for every call of that shape, vector width and GPU.
    The launchers take VEC from the tensors they are given, not from ``vec``."""

    #: Which of ``FORWARD_BRANCHES`` and ``BACKWARD_BRANCHES`` made the settings below.
    fwd_branch: str
    bwd_branch: str
    #: The backward takes two steps, row statistics then dx (``looped_kernels.py``): rows wider than
    #: ROW_LIMIT that ``reread_rows`` does not take.
    looped: bool
    #: The forward runs the two-pass kernel, one program per row.
    fwd_two_pass: bool
    #: Lanes per row (whole-row forward) or per chunk (two-pass forward).
    block_n: int
    fwd_block_m: int
    fwd_warps: int
    #: Forward grid: one program per row tile, or fewer persistent ones that loop over the tiles.
    fwd_programs: int
    fwd_stages: int
    #: Tile of the backward's dx/dgamma kernel: BLOCK_M rows by BLOCK_N columns (a segment when looped),
    #: and for whole rows a second piece of BLOCK_N2 columns after them, or none (0): ``row_pieces``.
    bwd_block_m: int
    bwd_block_n: int
    bwd_block_n2: int
    bwd_warps: int
    #: Rows of the float64 dgamma partials = persistent backward programs along the rows. Bounded by the
    #: GPU, never by the number of rows.
    partial_rows: int
    #: Each thread sums dgamma for its own (row, column) elements of the tile, over the program's tiles, in
    #: float32, and the tile's rows are summed once at the end (narrow rows of 16-bit x, whose rows spread
    #: over warps: a sum across warps every tile cost more than the tile's memory traffic; and 16-bit rows
    #: off 16 bytes in two pieces, which run on the narrow rows' settings), when programs
    #: take more than one tile; otherwise each tile's rows are summed as they come, into float64. Not for
    #: float32 x: over many rows the float32 running sums put its dgamma past float32's tolerance
    #: (docs/design.md).
    bwd_rowwise_dgamma: bool
    #: Whole rows too wide for one program to hold x, dy and its dgamma share at once: x and dy are read
    #: for the row sums and again, from cache, for dx and dgamma (``kernels._rmsnorm_bwd_reread_kernel``).
    bwd_reread: bool
    #: Backward grid: (programs along rows, column segments).
    bwd_grid: tuple[int, int]
    bwd_stages: int
    #: Looped rows: the backward's row statistics walk each row in chunks of this many lanes.
    stats_block_n: int
    stats_warps: int
    #: Columns a program of the dgamma column sum takes.
    sum_block_n: int
    #: Elements per vector load of x the plan was made for (``vector_width``); it chooses the branches.
    vec: int


@functools.lru_cache(maxsize=4096)
def plan(
    rows: int,
    n: int,
    gpu: Gpu,
    vec: int | None = None,
    x_bytes: int = 4,
    gamma_bytes: int = 4,
    residual: bool = False,
) -> Plan:
    """The plan for ``rows`` rows of ``n`` elements of ``x_bytes`` bytes on ``gpu``. ``vec``: elements per
    vector load of x (``vector_width``); None: as many as 16 bytes and N allow (rows that start on
    16-byte boundaries). ``residual``: the forward adds a residual (and writes h)."""
    if vec is None:
        vec = min(16 // x_bytes, n & -n)
    sum_block_n = INTERPRETER_SUM_BLOCK_N if gpu == INTERPRETER else SUM_BLOCK_N
    return Plan(
        **_forward(rows, n, gpu, vec, x_bytes, residual),
        **_backward(rows, n, gpu, vec, x_bytes, gamma_bytes, residual),
        sum_block_n=sum_block_n,
        vec=vec,
    )


def _forward(rows: int, n: int, gpu: Gpu, vec: int, x_bytes: int, residual: bool) -> dict:
    aligned = vec * x_bytes == 16
    block_n = triton.next_power_of_2(n)
    if residual and aligned and ROW_LIMIT < block_n <= RESIDUAL_ROW_LIMIT and 4 * n > 3 * block_n:
        return dict(
            fwd_branch="residual_wide_rows",
            fwd_two_pass=False,
            block_n=block_n,
            fwd_block_m=1,
            fwd_warps=RESIDUAL_WIDE_WARPS,
            fwd_programs=rows,
            fwd_stages=1,
        )
    two_pass = dict(fwd_two_pass=True, fwd_block_m=1, fwd_programs=rows, fwd_stages=1)
    if block_n <= ROW_LIMIT and aligned and block_n * x_bytes == TWO_PASS_ROW_BYTES and block_n == n:
        chunk = min(n, WIDE_FWD_CHUNK)
        return dict(fwd_branch="rows_of_16k", block_n=chunk, fwd_warps=TWO_PASS_WARPS, **two_pass)
    if aligned and block_n != n and n > WHOLE_ROW_FWD_LIMIT and (chunked := chunked_forward(n, x_bytes, gpu)):
        chunk, warps = chunked
        return dict(fwd_branch="chunks", block_n=chunk, fwd_warps=warps, **two_pass)
    if not aligned and block_n > ROW_LIMIT:
        warps = UNALIGNED_CHUNK_WARPS[x_bytes]
        chunk = CHUNK_ELEMENTS_PER_THREAD * 32 * warps
        return dict(fwd_branch="unaligned_chunks", block_n=chunk, fwd_warps=warps, **two_pass)
    if block_n > ROW_LIMIT:
        chunk, warps = looped_forward_chunk(n)
        return dict(fwd_branch="quarter_chunks", block_n=chunk, fwd_warps=warps, **two_pass)
    # Whole rows: all that is left, including rows that ``chunked_forward`` refuses on a GPU of small L2.
    block_m, warps = whole_row_tile(block_n, aligned, residual, n)
    tiles = triton.cdiv(rows, block_m)
    whole = dict(fwd_two_pass=False, block_n=block_n, fwd_block_m=block_m, fwd_warps=warps)
    if aligned:
        return dict(fwd_branch="whole_rows", fwd_programs=tiles, fwd_stages=1, **whole)
    # Narrow loads need more of them in flight: persistent programs that fetch their next tile while
    # computing this one. Pipelining needs a second tile to fetch: with one tile per program it only adds
    # a prologue.
    programs = min(tiles, UNALIGNED_FWD_PROGRAMS_PER_SM * gpu.sms)
    stages = (
        stages_that_fit(UNALIGNED_FWD_STAGES, (1 + residual) * block_m * block_n * x_bytes, gpu.smem_bytes)
        if programs < tiles
        else 1
    )
    return dict(fwd_branch="whole_rows_persistent", fwd_programs=programs, fwd_stages=stages, **whole)


def chunked_forward(n: int, x_bytes: int, gpu: Gpu) -> tuple[int, int] | None:
    """(chunk, warps) of the two-pass forward: the fewest of ``CHUNKED_FWD_WARPS`` that keep the rows in
    flight (one per program a multiprocessor holds) within ``L2_SHARE`` of L2, so that the second pass
    reads the row from L2; None when none does. Chunks of ``WIDE_FWD_CHUNK`` lanes for rows wider than
    that, of ``CHUNK_ELEMENTS_PER_THREAD`` lanes a thread otherwise. On an H200: 16-bit rows of up to 4170
    on 4 warps, up to 8341 on 8, up to 16682 on 16; float32 rows up to 4170 on 8, up to 8341 on 16."""

    def in_flight(warps: int) -> int:
        return gpu.threads_per_sm // (32 * warps) * gpu.sms * n * x_bytes

    for warps in CHUNKED_FWD_WARPS:
        if in_flight(warps) <= L2_SHARE * gpu.l2_bytes:
            return (WIDE_FWD_CHUNK if n > WIDE_FWD_CHUNK else CHUNK_ELEMENTS_PER_THREAD * 32 * warps), warps
    return None


def looped_forward_chunk(n: int) -> tuple[int, int]:
    """(chunk, warps) of the two-pass forward over rows of N > ``ROW_LIMIT`` that ``chunked_forward``
    does not take: quarter rows (half rows from ``2 * LOOP_FWD_MAX_CHUNK`` lanes), at most
    ``LOOP_FWD_MAX_CHUNK`` lanes. Where that chunk does not divide N, at most
    ``PADDED_LOOP_FWD_MAX_CHUNK``, so that the last chunk is mostly data (N = 40960: five full chunks of
    8192, not two of 32768 of which the second is three quarters padding)."""
    block_n = triton.next_power_of_2(n)
    chunk = min(block_n // 2 if block_n >= 2 * LOOP_FWD_MAX_CHUNK else block_n // 4, LOOP_FWD_MAX_CHUNK)
    if n % chunk:
        chunk = min(chunk, PADDED_LOOP_FWD_MAX_CHUNK)
    return chunk, 16 if block_n <= 16384 else 32


def whole_row_tile(block_n: int, aligned: bool = True, residual: bool = False, n: int | None = None) -> tuple[int, int]:
    """(rows per tile, warps) of the whole-row forward for rows of BLOCK_N lanes: about
    ``TILE_ELEMENTS`` lanes a tile, at most ``MAX_ROWS_PER_TILE`` rows; ``FWD_LANES_PER_THREAD`` lanes a
    thread for rows of at least ``WIDE_TILE_ROW_LANES`` read in 16-byte vectors (``aligned``), which keeps
    more rows in flight per warp, ``NARROW_FWD_LANES_PER_THREAD`` otherwise, twice that over tiles twice
    as large for narrower rows of N elements that leave lanes padded (N = 96 in 128 lanes: each thread's
    padded lanes carry no bytes); with a ``residual``, at least ``RESIDUAL_MIN_WARPS`` for aligned rows
    of at least ``WIDE_TILE_ROW_LANES``."""
    wide = aligned and block_n >= WIDE_TILE_ROW_LANES
    padded = aligned and not wide and n is not None and n != block_n
    tile, lanes = (2 * TILE_ELEMENTS, 2 * NARROW_FWD_LANES_PER_THREAD) if padded else (TILE_ELEMENTS, None)
    block_m = max(1, min(MAX_ROWS_PER_TILE, tile // block_n))
    lanes = lanes or (FWD_LANES_PER_THREAD if wide else NARROW_FWD_LANES_PER_THREAD)
    warps = max(1, min(8, block_m * block_n // (32 * lanes)))
    return block_m, max(warps, RESIDUAL_MIN_WARPS) if residual and wide else warps


def _backward(rows: int, n: int, gpu: Gpu, vec: int, x_bytes: int, gamma_bytes: int, residual: bool) -> dict:
    if triton.next_power_of_2(n) > ROW_LIMIT:  # x, dy and dgamma's share of a row do not fit one program
        if vec * x_bytes == 16 and reread_rows(n, x_bytes):
            return reread_backward(rows, n, gpu, x_bytes, gamma_bytes, residual)
        return looped_backward(rows, n, gpu, x_bytes, gamma_bytes, residual)
    narrow = triton.next_power_of_2(n) * x_bytes <= NARROW_ROW_BYTES
    unaligned = vec * x_bytes < 16
    # Two pieces for narrow rows and rows off 16 bytes; for wider aligned rows they were slower on these
    # settings (docs/design.md).
    block_n, block_n2 = row_pieces(n) if narrow or unaligned else (triton.next_power_of_2(n), 0)
    lanes = block_n + block_n2
    # Rows off 16 bytes in two pieces run as narrow rows do: their narrow loads want more programs in flight
    small = narrow or (unaligned and block_n2 > 0)
    per_sm, wanted = (NARROW_PROGRAMS_PER_SM, NARROW_STAGES) if small else (BWD_PROGRAMS_PER_SM, BWD_STAGES)
    block_m, warps = backward_tile(lanes, block_n, x_bytes)
    # Those 16-bit rows sum dgamma per tile element (tiles sized for float32 sums) only when programs
    # take more than one tile: with one tile each there is nothing to sum across tiles, and the smaller
    # tiles only double the programs and the partials, which made small problems slower (docs/design.md).
    rowwise = small and x_bytes == 2 and triton.cdiv(rows, block_m) > per_sm * gpu.sms
    if rowwise:
        block_m, warps = backward_tile(lanes, block_n, x_bytes, rowwise=True)
    warps = NARROW_WARPS if small else warps
    min_tiles = max(1, int(BWD_MIN_TILES_PER_SM * gpu.sms))
    if rows < min_tiles * block_m:  # a small problem: smaller tiles, so that the GPU gets more programs
        # int(): a symbolic row count (see plan_for) is specialized here, for problems this small only.
        block_m = min(block_m, triton.next_power_of_2(triton.cdiv(int(rows), min_tiles)))
    tiles = triton.cdiv(rows, block_m)
    programs = min(tiles, per_sm * gpu.sms)
    # the pipelines of the programs a multiprocessor holds share its shared memory; a stage holds a tile
    # of x and dy, and of dh with a residual
    smem = gpu.smem_bytes // per_sm
    stages = stages_that_fit(wanted, (2 + residual) * block_m * lanes * x_bytes, smem) if programs < tiles else 1
    return dict(
        bwd_branch="whole_rows",
        looped=False,
        bwd_block_m=block_m,
        bwd_block_n=block_n,
        bwd_block_n2=block_n2,
        bwd_warps=warps,
        partial_rows=programs,
        bwd_rowwise_dgamma=rowwise,
        bwd_reread=False,
        bwd_grid=(programs, 1),
        bwd_stages=stages,
        stats_block_n=0,
        stats_warps=0,
    )


def reread_backward(
    rows: int,
    n: int,
    gpu: Gpu,
    x_bytes: int,
    gamma_bytes: int,
    residual: bool,
    settings: tuple[int, int, int] | None = None,
) -> dict:
    """The backward's settings for whole rows of N > ``ROW_LIMIT`` read twice (``reread_rows``): one row a
    tile, in its pieces (``row_pieces``), on ``settings`` = (warps, programs a multiprocessor, stages), as
    deep as the stage buffers of the programs a multiprocessor holds fit, with dh's with a ``residual``.
    By default the row's line of ``REREAD_SETTINGS``, as one program of all its warps where its programs'
    stages do not fit together. 16-bit x sums dgamma in float32 over a program's rows (rows / programs
    terms), and float64 across programs."""
    block_n, block_n2 = row_pieces(n)
    row_bytes = (block_n + block_n2) * x_bytes
    stage_bytes = reread_stage_bytes(n, x_bytes, gamma_bytes, residual)
    warps, per_sm, stages = settings or next(s[1:] for s in REREAD_SETTINGS if row_bytes <= s[0])
    if settings is None and stages_that_fit(stages, stage_bytes, gpu.smem_bytes // per_sm) < stages:
        warps, per_sm = warps * per_sm, 1  # the same warps as one program, rather than a shallower pipeline
    programs = min(rows, per_sm * gpu.sms)
    return dict(
        bwd_branch="reread_rows",
        looped=False,
        bwd_block_m=1,
        bwd_block_n=block_n,
        bwd_block_n2=block_n2,
        bwd_warps=warps,
        partial_rows=programs,
        bwd_rowwise_dgamma=x_bytes == 2,
        bwd_reread=True,
        bwd_grid=(programs, 1),
        bwd_stages=stages_that_fit(stages, stage_bytes, gpu.smem_bytes // per_sm),
        stats_block_n=0,
        stats_warps=0,
    )


def reread_stage_bytes(n: int, x_bytes: int, gamma_bytes: int, residual: bool) -> int:
    """Shared memory a pipeline stage of the backward over rows read twice takes: both reads of x and dy,
    the load of gamma and, with a ``residual``, of dh, over the row's pieces."""
    return sum(row_pieces(n)) * ((4 + residual) * x_bytes + gamma_bytes)


def looped_backward(rows: int, n: int, gpu: Gpu, x_bytes: int, gamma_bytes: int, residual: bool) -> dict:
    """The backward's settings for rows of N > ``ROW_LIMIT`` in two steps (``looped_kernels.py``): row
    statistics in chunks of ``STATS_BLOCK_N``, then dx and dgamma over (row programs x column segments of
    ``SEG_BLOCK_N``)."""
    segments = triton.cdiv(n, SEG_BLOCK_N)
    programs = max(1, min(triton.cdiv(rows, SEG_BLOCK_M), SEG_PROGRAMS_PER_SM * gpu.sms // segments))
    # One depth for both steps: the one whose loads (row statistics: x, dy and gamma; dx: x, dy and, with
    # a residual, dh) take more room.
    per_stage = max(STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), (2 + residual) * SEG_BLOCK_M * SEG_BLOCK_N * x_bytes)
    return dict(
        bwd_branch="looped",
        looped=True,
        bwd_block_m=SEG_BLOCK_M,
        bwd_block_n=SEG_BLOCK_N,
        bwd_block_n2=0,
        bwd_warps=SEG_WARPS,
        partial_rows=programs,
        bwd_rowwise_dgamma=False,
        bwd_reread=False,
        bwd_grid=(programs, segments),
        bwd_stages=stages_that_fit(LOOP_STAGES, per_stage, gpu.smem_bytes),
        stats_block_n=STATS_BLOCK_N,
        stats_warps=STATS_WARPS,
    )


def reread_rows(n: int, x_bytes: int) -> bool:
    """Whether an aligned row of N > ``ROW_LIMIT`` takes the one-kernel backward that reads x and dy
    twice (``Plan.bwd_reread``): where its pieces are at most ``REREAD_MAX_LANES`` lanes holding at most
    ``REREAD_MAX_ROW_BYTES`` of x (16-bit rows of 8193-16384, float32 rows of 8193-12288), where it
    measured faster than the two steps (docs/design.md)."""
    lanes = sum(row_pieces(n))
    return lanes <= REREAD_MAX_LANES and lanes * x_bytes <= REREAD_MAX_ROW_BYTES


def row_pieces(n: int) -> tuple[int, int]:
    """The whole-row backward's lanes for a row of N: one power of two (N's next), or two, the next lower
    power of two and after it the power of two that covers the rest, where those are fewer lanes
    (N = 5120: 4096 + 1024, not 8192; N = 4097: 4096 + 1). Padding lanes hold registers and load
    nothing: fewer of them leave room for more rows in flight."""
    block_n = triton.next_power_of_2(n)
    if block_n == n:
        return block_n, 0
    first = block_n // 2
    second = triton.next_power_of_2(n - first)
    return (first, second) if second < first else (block_n, 0)


def backward_tile(lanes: int, block_n: int, x_bytes: int, rowwise: bool = False) -> tuple[int, int]:
    """(rows per tile, warps) of the whole-row backward for rows of ``lanes`` lanes whose first piece
    (``row_pieces``) has ``block_n``: ``BWD_TILE_BYTES`` of x a tile (rounded down to a power of two of
    rows), warps that span the first piece with one 16-byte vector a thread (at most ``BWD_MAX_WARPS``),
    so that the per-column dgamma sum over the tile's rows stays inside each thread. Rows of at most
    ``NARROW_ROW_BYTES`` (per-head q/k norms, small models) would get one or two warps that way, and the
    GPU too few warps to hide latency: they take ``NARROW_WARPS`` whatever N and as many rows as
    ``BWD_TILE_BYTES`` of x holds, at most ``NARROW_MAX_ROWS_PER_TILE``, and ``_backward`` gives them
    ``NARROW_PROGRAMS_PER_SM`` programs a multiprocessor. ``rowwise`` (dgamma summed per tile element,
    ``Plan.bwd_rowwise_dgamma``): the bytes of x counted as computed, in float32, because each element
    keeps a float32 sum."""
    if lanes * x_bytes <= NARROW_ROW_BYTES:
        elem_bytes = max(x_bytes, 4) if rowwise else x_bytes
        return min(NARROW_MAX_ROWS_PER_TILE, _floor_power_of_two(BWD_TILE_BYTES // (lanes * elem_bytes))), NARROW_WARPS
    block_m = max(1, min(MAX_ROWS_PER_TILE, _floor_power_of_two(BWD_TILE_BYTES // (lanes * x_bytes))))
    return block_m, max(1, min(BWD_MAX_WARPS, block_n * x_bytes // (16 * 32)))


def _floor_power_of_two(v: int) -> int:
    return 1 << (v.bit_length() - 1) if v >= 1 else 1


def stages_that_fit(wanted: int, bytes_per_stage: int, smem_bytes: int) -> int:
    """The deepest pipeline up to ``wanted`` whose buffers fit: Triton keeps stages - 1 copies of one
    iteration's pipelined loads in shared memory, beside ``SMEM_RESERVE_BYTES`` of its own."""
    return max(1, min(wanted, 1 + (smem_bytes - SMEM_RESERVE_BYTES) // max(1, bytes_per_stage)))


def vector_width(n: int, *views: torch.Tensor, traced: bool = False) -> int:
    """Elements one vector load can take from every row of each (rows, N) view: N, each view's row stride
    and its start (in elements) are multiples of it. The kernels pass it on to the compiler (VEC), which
    by itself only notices multiples of 16. Called on every launch, so kept to a few integer operations.

    ``traced``: the views may be torch.compile's fake tensors, which have no data pointer. Their storage
    is taken to start 16-byte aligned, as Inductor's buffers do (and the graph inputs it copies when they
    do not), so their offset decides. VEC only promises what N and the strides are multiples of; where
    the data itself starts, the compiler learns from its own checks of the pointers."""
    size = views[0].element_size()
    g = n
    for v in views:
        start = int(v.storage_offset()) * size if traced else v.data_ptr()
        g = math.gcd(g, start // size if start % size == 0 else 1, int(v.stride(0)) if v.shape[0] > 1 else 0)
    return min(16 // size, g & -g)


@functools.cache
def cuda_gpu(index: int) -> Gpu:
    """The limits of CUDA device ``index``, as the driver reports them."""
    props = torch.cuda.get_device_properties(index)
    return Gpu(
        sms=props.multi_processor_count,
        smem_bytes=getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM_BYTES,
        l2_bytes=props.L2_cache_size,
        threads_per_sm=props.max_threads_per_multi_processor,
    )


def gpu_for(t: torch.Tensor) -> Gpu:
    """The GPU the kernels run ``t`` on: its CUDA device's limits, or ``INTERPRETER`` for a CPU tensor
    (the kernels take CPU tensors only under Triton's interpreter)."""
    index = t.get_device()
    return cuda_gpu(index) if index >= 0 else INTERPRETER


def plan_for(x2: torch.Tensor, gamma: torch.Tensor, vec: int | None = None, residual: bool = False) -> Plan:
    """The plan for the (rows, N) view ``x2`` and ``gamma`` on their device's GPU (``gpu_for``); ``vec``:
    ``vector_width`` of ``x2`` when the caller has it already; ``residual``: the forward adds one."""
    rows, n = x2.shape[0], int(x2.shape[1])
    vec = vector_width(n, x2) if vec is None else vec
    # Traced by torch.compile with dynamic=True, the row count is symbolic: planned uncached, and each
    # rule's comparison of it becomes a guard of the compiled graph.
    make = plan if isinstance(rows, int) else plan.__wrapped__
    return make(rows, n, gpu_for(x2), vec, x2.element_size(), gamma.element_size(), residual)
