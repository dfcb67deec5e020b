"""Launch plans: what must hold on every branch of ``launch.py``, for many problems and GPUs.

Over a grid of row lengths, row counts, dtypes, vector widths and GPU records, every plan fits the GPU's
shared memory, keeps its dgamma partials within a bound set by the GPU alone, and gives the kernels the
shapes they need. Then each branch runs a small problem through the kernels, with a plan made for a GPU
record that selects it, and matches the oracle."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
import triton

from rmsnorm_kernel.ops import launch, launchers
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.reference import add_oracle, oracle
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs

#: A GPU of little shared memory and L2 and few, small multiprocessors.
SMALL = launch.Gpu(sms=16, smem_bytes=48 * 1024, l2_bytes=1024 * 1024, threads_per_sm=1024)
#: Many multiprocessors and a large L2, with the CUDA default of 48 KiB shared memory a program.
WIDE = launch.Gpu(sms=256, smem_bytes=48 * 1024, l2_bytes=128 * 1024 * 1024, threads_per_sm=1536)
GPUS = {"H200": launch.H200, "interpreter": launch.INTERPRETER, "small": SMALL, "wide": WIDE}
#: (x bytes, gamma bytes): float32, half precision, and half x with float32 gamma.
ELEMENT_BYTES = {"float32": (4, 4), "half": (2, 2), "mixed": (2, 4)}
NS = sorted(
    {1, 7, 64, 255, 257, 1000, 1024, 2047, 2049, 3000, 3072, 4096, 4097, 5120, 6244, 7000, 8191, 8192, 8193}
    | {9216, 12288, 12295, 16384, 20000, 24000, 24576, 32768, 40000, 65535, MAX_N}
)
ROWS = (1, 3, 17, 100, 4096, 10**5, 10**8)
VECS = (None, 1, 2)
RESIDUALS = (False, True)
#: The dgamma partials (and so the backward's programs along the rows) never exceed this many rows per
#: multiprocessor, whatever the number of rows.
PARTIAL_ROWS_PER_SM = 2


def _problems():
    for (gpu_name, gpu), (dtype_name, (x_bytes, gamma_bytes)), n, rows, vec, residual in itertools.product(
        GPUS.items(), ELEMENT_BYTES.items(), NS, ROWS, VECS, RESIDUALS
    ):
        if vec is not None and (n % vec or vec * x_bytes > 16):
            continue  # vector_width never gives a width that does not divide N or passes 16 bytes
        key = (gpu_name, dtype_name, n, rows, vec, residual)
        yield key, gpu, (rows, n, gpu, vec, x_bytes, gamma_bytes, residual)


PROBLEMS = list(_problems())


def _power_of_two(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def pipelined_loads(p: launch.Plan, x_bytes: int, gamma_bytes: int, residual: bool) -> dict[str, tuple[int, int]]:
    """kernel -> (stages, bytes one loop iteration loads): what its software pipeline buffers."""
    if p.fwd_two_pass:
        fwd = p.block_n * (x_bytes + gamma_bytes)  # the second pass loads x and gamma
    else:
        fwd = p.fwd_block_m * p.block_n * (1 + residual) * x_bytes  # x, and the residual
    # The backward loads x and dy over the row's pieces, again with gamma when it reads rows twice, and
    # dh with a residual.
    lanes = p.bwd_block_m * (p.bwd_block_n + p.bwd_block_n2)
    bwd = lanes * ((4 if p.bwd_reread else 2) + residual) * x_bytes + (lanes * gamma_bytes if p.bwd_reread else 0)
    out = {"forward": (p.fwd_stages, fwd), "backward": (p.bwd_stages, bwd)}
    if p.looped:
        out["row statistics"] = (p.bwd_stages, p.stats_block_n * (2 * x_bytes + gamma_bytes))
    return out


def test_the_grid_reaches_every_branch_on_each_gpu_record():
    """So that the checks below hold on every branch, not only on the common ones."""
    fwd, bwd = set(), set()
    for _, _, args in PROBLEMS:
        p = launch.plan(*args)
        fwd.add(p.fwd_branch)
        bwd.add(p.bwd_branch)
    assert fwd == set(launch.FORWARD_BRANCHES) and bwd == set(launch.BACKWARD_BRANCHES)


def test_every_plan_s_pipeline_buffers_fit_the_gpu_s_shared_memory():
    """Triton keeps stages - 1 copies of a loop iteration's pipelined loads in shared memory, beside
    scratch of its own (``SMEM_RESERVE_BYTES``); a launch that asks for more than the GPU has fails."""
    for key, gpu, args in PROBLEMS:
        p = launch.plan(*args)
        for kernel, (stages, per_stage) in pipelined_loads(p, *args[4:]).items():
            assert stages >= 1, (key, kernel, p)
            used = (stages - 1) * per_stage + launch.SMEM_RESERVE_BYTES
            assert used <= gpu.smem_bytes, (key, kernel, p)


def test_pipelines_are_cut_by_a_gpu_s_shared_memory_not_by_the_plan():
    """A GPU with little shared memory gets shallower pipelines than the H200 for the same problem."""
    cut = [
        key
        for key, gpu, args in PROBLEMS
        if gpu is SMALL and launch.plan(*args).bwd_stages < launch.plan(*args[:2], launch.H200, *args[3:]).bwd_stages
    ]
    assert cut


@pytest.mark.parametrize("smem_bytes", [48 * 1024, 100 * 1024, 227 * 1024])
def test_stages_that_fit_gives_the_deepest_pipeline_that_fits(smem_bytes):
    usable = smem_bytes - launch.SMEM_RESERVE_BYTES
    for wanted, per_stage in itertools.product(range(1, 7), (1, 4096, 16 * 1024, 32 * 1024, 64 * 1024, 256 * 1024)):
        s = launch.stages_that_fit(wanted, per_stage, smem_bytes)
        assert 1 <= s <= wanted
        assert s == 1 or (s - 1) * per_stage <= usable
        assert s == wanted or s * per_stage > usable  # one stage more would not fit


def test_dgamma_partials_are_bounded_by_the_gpu_whatever_the_rows():
    """The float64 partials hold P rows of N (P * N * 8 bytes): P is at most ``PARTIAL_ROWS_PER_SM`` a
    multiprocessor and never grows with the rows."""
    for key, gpu, args in PROBLEMS:
        p = launch.plan(*args)
        assert 1 <= p.partial_rows <= PARTIAL_ROWS_PER_SM * gpu.sms, (key, p)
        # the whole backward grid too, unless a row has more column segments than that: then one program each
        programs, segments = p.bwd_grid
        assert programs * segments <= max(PARTIAL_ROWS_PER_SM * gpu.sms, segments), (key, p)
        assert p.bwd_grid[0] == p.partial_rows, (key, p)  # one partial row per program along the rows
    for gpu, (x_bytes, gamma_bytes), n, vec in itertools.product(GPUS.values(), ELEMENT_BYTES.values(), NS, VECS):
        if vec is None or (n % vec == 0 and vec * x_bytes <= 16):
            many = {launch.plan(m, n, gpu, vec, x_bytes, gamma_bytes).partial_rows for m in (10**5, 10**6, 10**8)}
            assert len(many) == 1, (gpu, n, vec)


def test_persistent_forward_grids_are_bounded_by_the_gpu():
    for key, gpu, args in PROBLEMS:
        p = launch.plan(*args)
        if p.fwd_branch == "whole_rows_persistent":
            assert p.fwd_programs <= PARTIAL_ROWS_PER_SM * gpu.sms, (key, p)


def test_every_plan_gives_the_kernels_shapes_they_can_run():
    """tl.arange needs powers of two; a whole-row tile must hold the row; the grids must cover every row
    and column; the looped backward must run exactly where a row is longer than a whole-row tile."""
    for key, _, args in PROBLEMS:
        rows, n, _, vec, x_bytes, _, residual = args
        p = launch.plan(*args)
        assert p.vec == (vec or min(16 // x_bytes, n & -n)), (key, p)
        for name in ("block_n", "fwd_block_m", "bwd_block_m", "bwd_block_n"):
            assert _power_of_two(getattr(p, name)), (key, name, p)
        for name in ("fwd_warps", "bwd_warps"):
            assert _power_of_two(getattr(p, name)) and getattr(p, name) <= 32, (key, name, p)
        assert p.fwd_programs >= 1 and p.fwd_stages >= 1 and p.bwd_stages >= 1, (key, p)
        if p.fwd_two_pass:  # one program a row, chunks no wider than the row's lanes
            assert (p.fwd_programs, p.fwd_block_m) == (rows, 1), (key, p)
            assert p.block_n <= triton.next_power_of_2(n), (key, p)
        else:
            assert p.block_n >= n, (key, p)
            tiles = triton.cdiv(rows, p.fwd_block_m)
            assert p.fwd_programs <= tiles, (key, p)
            if p.fwd_branch in ("whole_rows", "residual_wide_rows"):
                assert p.fwd_programs == tiles, (key, p)
        assert p.looped == (p.bwd_branch == "looped") and p.bwd_reread == (p.bwd_branch == "reread_rows"), (key, p)
        assert (triton.next_power_of_2(n) > launch.ROW_LIMIT) == (p.bwd_branch != "whole_rows"), (key, p)
        if p.bwd_reread:  # one whole row at a time, of at most REREAD_MAX_LANES lanes
            assert p.bwd_block_m == 1 and p.bwd_block_n + p.bwd_block_n2 <= launch.REREAD_MAX_LANES, (key, p)
        assert residual or p.fwd_branch != "residual_wide_rows", (key, p)
        if p.looped:
            assert p.bwd_grid[1] * p.bwd_block_n >= n and _power_of_two(p.stats_block_n), (key, p)
            assert _power_of_two(p.stats_warps) and p.stats_warps <= 32, (key, p)
        else:
            assert p.bwd_block_n + p.bwd_block_n2 >= n and p.bwd_grid == (max(1, p.partial_rows), 1), (key, p)
            assert p.bwd_block_n2 == 0 or (_power_of_two(p.bwd_block_n2) and p.bwd_block_n2 < p.bwd_block_n), (key, p)
            assert p.bwd_block_n2 == 0 or p.bwd_block_n < n, (key, p)  # a second piece only past the first


@pytest.mark.parametrize(
    "n, dtype, residual, settings",
    [
        (9728, torch.float32, False, (16, 1, 2)),  # 8192 + 2048 lanes: both reads' stage buffers take 200 KiB of 227
        (9728, torch.float32, True, (16, 1, 1)),  # with dh's loads too a second stage would take 240 KiB
        (12288, torch.float32, False, (16, 1, 1)),  # 8192 + 4096 lanes: a second stage would take 240 KiB
        (16384, torch.bfloat16, False, (32, 1, 1)),  # one stage asked for
        (10240, torch.bfloat16, False, (8, 2, 2)),  # two programs a multiprocessor, 100 KiB a stage each
        (12288, torch.bfloat16, False, (16, 1, 2)),  # two programs' stages would take 240 KiB: one of 16 warps
        (10240, torch.bfloat16, True, (16, 1, 2)),  # with dh's loads, the same
    ],
)
def test_rows_read_twice_are_pipelined_only_where_every_load_of_each_program_fits(n, dtype, residual, settings):
    p = launch.plan(4096, n, launch.H200, None, dtype.itemsize, dtype.itemsize, residual)
    assert p.bwd_branch == "reread_rows"
    assert (p.bwd_warps, p.bwd_grid[0] // launch.H200.sms, p.bwd_stages) == settings


def test_the_chunked_forward_keeps_its_rows_in_flight_within_its_l2_share():
    """Its second pass reads each row again, from L2: the rows of every program the GPU holds at once fit
    in ``L2_SHARE`` of it."""
    for key, gpu, args in PROBLEMS:
        rows, n, _, _, x_bytes, *_ = args
        p = launch.plan(*args)
        if p.fwd_branch == "chunks":
            in_flight = gpu.threads_per_sm // (32 * p.fwd_warps) * gpu.sms * n * x_bytes
            assert in_flight <= launch.L2_SHARE * gpu.l2_bytes, (key, p)


def test_plans_are_cached_per_shape_vector_width_gpu_and_residual():
    a = launch.plan(4096, 3072, launch.H200, None, 2, 2)
    assert launch.plan(4096, 3072, launch.H200, None, 2, 2) is a
    assert launch.plan(4096, 3072, SMALL, None, 2, 2) is not a
    assert launch.plan(4096, 3072, launch.H200, 2, 2, 2) is not a
    assert launch.plan(4096, 3072, launch.H200, None, 2, 2, True) is not a


@pytest.mark.parametrize(
    "n, residual_branch", [(16384, "residual_wide_rows"), (16000, "residual_wide_rows"), (12288, "chunks")]
)
def test_a_residual_takes_one_pass_over_wide_rows_that_are_mostly_data(n, residual_branch):
    """Two passes would read back the h just written; rows padded by a quarter or more keep them."""
    plain = launch.plan(4096, n, launch.H200, None, 2, 2)
    residual = launch.plan(4096, n, launch.H200, None, 2, 2, True)
    assert plain.fwd_branch != "residual_wide_rows"
    assert residual.fwd_branch == residual_branch
    # the backward does not depend on the residual
    assert {k: v for k, v in vars(residual).items() if k.startswith("bwd")} == {
        k: v for k, v in vars(plain).items() if k.startswith("bwd")
    }


@pytest.mark.parametrize(
    "n, x_bytes, branch, chunk, warps",
    [
        (3072, 2, "chunks", 512, 4),  # rows of up to WIDE_FWD_CHUNK: 4 lanes a thread
        (4608, 2, "chunks", 4096, 8),  # wider: chunks of WIDE_FWD_CHUNK, a last one an eighth data
        (7680, 2, "chunks", 4096, 8),
        (8704, 2, "chunks", 4096, 16),  # 8 warps would keep over L2_SHARE of L2 in flight
        (15872, 2, "chunks", 4096, 16),
        (3072, 4, "chunks", 1024, 8),
        (7680, 4, "chunks", 4096, 16),
        (8192, 2, "rows_of_16k", 4096, 16),
        (4096, 4, "rows_of_16k", 4096, 16),
        (16384, 2, "quarter_chunks", 4096, 16),
        (13312, 4, "quarter_chunks", 4096, 16),  # float32: too many bytes in flight even on 16 warps
        (24576, 2, "quarter_chunks", 8192, 32),
        (12295, 2, "unaligned_chunks", 1024, 8),
        (12295, 4, "unaligned_chunks", 2048, 16),
    ],
)
def test_the_two_pass_forward_takes_chunks_of_4096_lanes_past_4096_on_warps_the_l2_allows(
    n, x_bytes, branch, chunk, warps
):
    """On an H200: the plans that the forward's rules give, as fitted (docs/design.md)."""
    p = launch.plan(20000, n, launch.H200, None, x_bytes, x_bytes)
    assert (p.fwd_branch, p.block_n, p.fwd_warps) == (branch, chunk, warps), p


@pytest.mark.parametrize(
    "n, x_bytes, bm, rowwise",
    [
        (512, 2, 8, True),  # 16 KiB of x once in float32: 4096 elements
        (96, 2, 32, True),
        (256, 4, 16, False),  # float32: dgamma summed into float64 tile by tile
        (128, 8, 16, False),  # float64: 2048 elements
        (1024, 2, 4, True),
        (2048, 2, 4, False),  # past NARROW_ROW_BYTES: 16 KiB of x as stored, each tile summed in-thread
    ],
)
def test_narrow_backward_tiles_hold_16_kib_as_computed_and_16_bit_rows_sum_dgamma_per_row(n, x_bytes, bm, rowwise):
    p = launch.plan(10**6, n, launch.H200, None, x_bytes, x_bytes)
    assert (p.bwd_block_m, p.bwd_rowwise_dgamma) == (bm, rowwise), p


@pytest.mark.parametrize(
    "rows, n, bm, programs, rowwise",
    [
        (1024, 1024, 8, 128, False),  # 128 tiles of 16 KiB of x as stored: one a program, nothing to sum across
        (2112, 1024, 8, 264, False),  # 264 such tiles: still one a program (2 programs a multiprocessor)
        (2113, 1024, 4, 264, True),  # 265: programs would loop, so float32 sums per element and their tiles
        (2048, 256, 32, 64, False),
    ],
)
def test_narrow_16_bit_rows_sum_dgamma_per_element_only_when_programs_take_several_tiles(
    rows, n, bm, programs, rowwise
):
    p = launch.plan(rows, n, launch.H200, None, 2, 2)
    assert (p.bwd_block_m, p.partial_rows, p.bwd_rowwise_dgamma) == (bm, programs, rowwise), p


@pytest.mark.parametrize("n", [512, 1024, 2048, 4096])
def test_a_residual_gives_whole_row_tiles_at_least_four_warps_and_the_same_rows(n):
    plain = launch.plan(20000, n, launch.H200, None, 2, 2)
    residual = launch.plan(20000, n, launch.H200, None, 2, 2, True)
    assert plain.fwd_branch == residual.fwd_branch == "whole_rows"
    assert residual.fwd_block_m == plain.fwd_block_m and residual.fwd_warps == max(4, plain.fwd_warps)
    assert plain.fwd_warps < 4  # so the residual changed them


def test_plan_for_plans_cpu_tensors_for_the_interpreter_record():
    x, gamma, _ = make_inputs((5, 3000), torch.bfloat16, "cpu")
    assert launch.gpu_for(x) is launch.INTERPRETER
    assert launch.plan_for(x, gamma) == launch.plan(5, 3000, launch.INTERPRETER, 8, 2, 2)


# --------------------------------------------------------------------------------------------------
# Each branch against the oracle
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    direction: str  # "fwd" or "bwd"
    branch: str
    gpu: str
    shape: tuple[int, int]
    dtype: torch.dtype
    gamma_dtype: torch.dtype | None = None
    residual: bool = False

    def __str__(self) -> str:
        gamma = f"-gamma_{self.gamma_dtype}" if self.gamma_dtype else ""
        residual = "-residual" if self.residual else ""
        shape = f"{self.shape[0]}x{self.shape[1]}"
        return f"{self.direction}-{self.branch}-{self.gpu}-{shape}-{self.dtype}{gamma}{residual}"


BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
BRANCH_CASES = [
    Case("fwd", "residual_wide_rows", "H200", (2, 16384), BF16, residual=True),
    Case("fwd", "rows_of_16k", "H200", (3, 4096), F32),  # one chunk
    Case("fwd", "rows_of_16k", "H200", (3, 8192), BF16),  # two chunks of WIDE_FWD_CHUNK
    Case("fwd", "chunks", "H200", (5, 3072), BF16),  # whole chunks
    Case("fwd", "chunks", "H200", (5, 3000), BF16),  # a partial last chunk
    Case("fwd", "chunks", "H200", (2, 9216), BF16, F32),  # past ROW_LIMIT
    Case("fwd", "chunks", "H200", (2, 12288), BF16),  # past ROW_LIMIT, whole chunks of WIDE_FWD_CHUNK
    Case("fwd", "chunks", "H200", (2, 10240), F16),  # past ROW_LIMIT, a last chunk half data
    Case("fwd", "chunks", "H200", (2, 5120), BF16),  # chunks of WIDE_FWD_CHUNK, a last chunk a quarter data
    Case("fwd", "unaligned_chunks", "H200", (2, 12295), BF16, F32),  # rows off 16-byte boundaries
    Case("fwd", "unaligned_chunks", "H200", (2, 12295), F32),
    Case("fwd", "quarter_chunks", "H200", (2, 16384), BF16),
    Case("fwd", "quarter_chunks", "small", (2, 9216), BF16),  # rows in flight too many for its L2
    Case("fwd", "whole_rows", "H200", (17, 1000), BF16),
    Case("fwd", "whole_rows_persistent", "H200", (17, 257), F32),  # rows off 16-byte boundaries
    Case("fwd", "whole_rows", "small", (3, 7000), BF16),  # no chunk fits its L2 share
    Case("fwd", "whole_rows_persistent", "interpreter", (7, 4097), F16),  # more tiles than programs
    Case("bwd", "whole_rows", "H200", (17, 257), F32),  # a small problem: one row a tile
    Case("bwd", "whole_rows", "interpreter", (60, 600), BF16, F32),  # narrow rows, several tiles a program
    Case("bwd", "whole_rows", "interpreter", (300, 96), BF16),  # narrow rows of many rows a tile
    Case("bwd", "whole_rows", "interpreter", (40, 2048), F32),  # more tiles than programs
    Case("bwd", "whole_rows", "small", (33, 3000), F16),
    Case("bwd", "reread_rows", "H200", (2, 16384), BF16),
    Case("bwd", "reread_rows", "interpreter", (3, 8704), F32),  # more rows than programs
    Case("bwd", "looped", "interpreter", (5, 8193), F32),
    Case("bwd", "looped", "H200", (3, 20000), BF16, F32),
]


def test_the_branch_cases_name_every_branch():
    assert {c.branch for c in BRANCH_CASES if c.direction == "fwd"} == set(launch.FORWARD_BRANCHES)
    assert {c.branch for c in BRANCH_CASES if c.direction == "bwd"} == set(launch.BACKWARD_BRANCHES)


@pytest.mark.parametrize("case", BRANCH_CASES, ids=str)
def test_each_branch_matches_the_oracle(case, device):
    x, gamma, dy = make_inputs(case.shape, case.dtype, device, gamma_dtype=case.gamma_dtype)
    rows, n = case.shape
    gpu = GPUS[case.gpu]
    p = launch.plan(rows, n, gpu, launch.vector_width(n, x), x.element_size(), gamma.element_size(), case.residual)
    assert getattr(p, f"{case.direction}_branch") == case.branch, p
    y_ref, dx_ref, dgamma_ref = oracle(x, gamma, dy)
    if case.residual:
        residual, _, dh = make_inputs(case.shape, case.dtype, device, seed=1)
        y_ref, h_ref, *_ = add_oracle(x, residual, gamma, dy, dh)
        y, h = launchers.rmsnorm_forward(x, gamma, 1e-6, p, residual=residual)
        got = {"y": (y, y_ref, None), "h": (h, h_ref, None)}
    elif case.direction == "fwd":
        got = {"y": (launchers.rmsnorm_forward(x, gamma, 1e-6, p), y_ref, None)}
    else:
        dx, dgamma = launchers.rmsnorm_backward(dy, x, gamma, 1e-6, p)
        # dgamma of half x summed into float32 gamma: judged at x's precision, as everywhere
        got = {"dx": (dx, dx_ref, None), "dgamma": (dgamma, dgamma_ref, case.gamma_dtype and case.dtype)}
    for name, (value, want, dtype) in got.items():
        c = compare(value, want, dtype)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"


@pytest.mark.parametrize(
    "n, dtype, layout, expected",
    [
        (1000, torch.bfloat16, "contiguous", 8),  # 2000-byte rows: 16-byte vectors
        (1000, torch.float32, "contiguous", 4),
        (1004, torch.bfloat16, "contiguous", 4),  # 1004 = 4 x 251
        (4097, torch.float16, "contiguous", 1),
        (1000, torch.bfloat16, "slice of 1004", 4),  # the row stride is what limits it
        (1000, torch.bfloat16, "offset by 1", 1),  # the first row starts 2 bytes past a boundary
        (1000, torch.bfloat16, "one row, offset by 8", 8),  # one row: no stride to honour
        (1000, torch.bfloat16, "broadcast", 8),  # stride 0: every row is the first
    ],
)
def test_vector_width_divides_n_and_every_row_stride_and_start(n, dtype, layout, expected):
    base = torch.zeros(4 * 4100 + 16, dtype=dtype)
    if layout == "contiguous":
        x2 = base[: 4 * n].view(4, n)
    elif layout == "slice of 1004":
        x2 = base[: 4 * 1004].view(4, 1004)[:, :n]
    elif layout == "offset by 1":
        x2 = base[1 : 1 + 4 * n].view(4, n)
    elif layout == "one row, offset by 8":
        x2 = base[8 : 8 + n].view(1, n)
    else:
        x2 = base[:n].view(1, n).expand(4, n)
    assert launch.vector_width(n, x2) == expected


def test_a_row_between_powers_of_two_takes_two_pieces_where_they_are_fewer_lanes():
    """The whole-row backward's lanes (``row_pieces``): N = 5120 as 4096 + 1024, not 8192; one piece
    where N is a power of two, or where the second piece would be as wide as the first."""
    assert launch.row_pieces(5120) == (4096, 1024)
    assert launch.row_pieces(4097) == (4096, 1)
    assert launch.row_pieces(257) == (256, 1)
    assert launch.row_pieces(3) == (2, 1)
    assert launch.row_pieces(4096) == (4096, 0)
    assert launch.row_pieces(1) == (1, 0)
    assert launch.row_pieces(6244) == (8192, 0)  # 4096 + 4096 is no fewer lanes
    assert launch.row_pieces(1000) == (1024, 0)


def test_two_pieces_are_planned_for_narrow_rows_and_rows_off_16_bytes_only():
    """Where they measured faster: narrow rows (576 = 512 + 64) and rows off 16 bytes (4097 = 4096 + 1);
    aligned rows past 2 KiB keep one piece of the next power of two (5120 in 8192 lanes)."""

    def pieces(n: int, x_bytes: int) -> tuple[int, int]:
        p = launch.plan(65536, n, launch.H200, None, x_bytes, x_bytes)
        return p.bwd_block_n, p.bwd_block_n2

    assert pieces(576, 2) == (512, 64)
    assert pieces(96, 2) == (64, 32)
    assert pieces(4097, 2) == (4096, 1)
    assert pieces(4097, 4) == (4096, 1)
    assert pieces(5120, 2) == (8192, 0)
    assert pieces(2560, 4) == (4096, 0)
    assert pieces(4096, 2) == (4096, 0)


def test_rows_off_16_bytes_in_two_pieces_take_the_narrow_rows_programs():
    """4 warps, two programs a multiprocessor, 3 stages; dgamma summed per tile element for 16-bit x only."""
    for x_bytes, rowwise in ((2, True), (4, False)):
        p = launch.plan(32768, 4097, launch.H200, None, x_bytes, x_bytes)
        assert (p.bwd_warps, p.partial_rows, p.bwd_stages, p.bwd_rowwise_dgamma) == (4, 264, 3, rowwise), p
    p = launch.plan(32768, 6244, launch.H200, None, 2, 2)  # off 16 bytes in one piece: as aligned rows
    assert (p.bwd_block_n2, p.bwd_warps, p.partial_rows) == (0, 8, 132), p
