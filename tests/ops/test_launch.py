"""Launch plans: the stated rules give the expected settings, fit the GPU, and bound the dgamma partials.
Expected values are worked out by hand from the rules in ``launch.py``'s docstring, on an H200's limits."""

import dataclasses

import pytest
import torch

from rmsnorm_kernel.ops import launch
from rmsnorm_kernel.ops.contract import MAX_N

H200 = launch.H200
SMALL_SMEM = dataclasses.replace(H200, smem_bytes=48 * 1024)


def test_the_h200_stand_in_has_the_h200_s_limits():
    # 132 multiprocessors, 227 KiB of opt-in shared memory, 60 MiB of L2 (as torch reports it), 2048 threads
    assert (H200.sms, H200.smem_bytes, H200.l2_bytes, H200.threads_per_sm) == (132, 232448, 62914560, 2048)


@pytest.mark.parametrize(
    "block_n, expected",
    [
        (1, (16, 1)),  # 16 rows of one lane share a tile
        (64, (16, 2)),
        (512, (4, 4)),  # 4 rows make a 2048-element tile
        (2048, (1, 4)),
        (8192, (1, 8)),  # 8 warps at most
    ],
)
def test_whole_row_forward_tiles_follow_rule_1a(block_n, expected):
    assert launch.whole_row_tile(block_n) == expected


@pytest.mark.parametrize(
    "n, x_bytes, expected",
    [
        (3072, 2, (512, 4)),  # 16 programs x 132 x 6 KiB = 13.0 MB <= 0.4 x 60 MiB = 25.2 MB
        (7168, 2, (1024, 8)),  # 4 warps: 30.3 MB, over; 8 warps: 15.1 MB
        (15360, 2, (2048, 16)),  # 8 warps: 32.4 MB; 16 warps: 16.2 MB
        (23000, 2, (2048, 16)),  # 4 x 132 x 46000 B = 24.3 MB
        (24000, 2, None),  # 25.3 MB even at 16 warps: the looped forward's quarter-row chunks instead
        (5120, 4, (1024, 8)),  # 4 warps: 43.3 MB; 8 warps: 21.6 MB
        (12288, 4, None),  # 26.0 MB at 16 warps
    ],
)
def test_chunked_forward_takes_the_fewest_warps_whose_rows_in_flight_fit_the_l2_share(n, x_bytes, expected):
    assert launch.chunked_forward(n, x_bytes, H200) == expected


@pytest.mark.parametrize("n, expected", [(8193, (4096, 16)), (32768, (8192, 32)), (65536, (32768, 32))])
def test_looped_forward_chunks_follow_rule_1c(n, expected):
    assert launch.looped_forward_chunk(launch.triton.next_power_of_2(n)) == expected


@pytest.mark.parametrize(
    "n, x_bytes, kind",
    [
        (1024, 2, "whole"),  # a power of two
        (1536, 2, "whole"),  # short: up to WHOLE_ROW_FWD_LIMIT
        (4096, 2, "whole"),
        (3072, 2, "chunked"),
        (5120, 2, "chunked"),
        (9216, 2, "chunked"),  # past ROW_LIMIT, still within the L2 share
        (8192, 2, "one chunk"),  # 16 KiB rows
        (4096, 4, "one chunk"),
        (16384, 2, "quarter rows"),  # a power of two past ROW_LIMIT
        (24000, 2, "quarter rows"),  # past the L2 share
        (12288, 4, "quarter rows"),
    ],
)
def test_aligned_rows_take_the_forward_their_length_calls_for(n, x_bytes, kind):
    p = launch.plan(1000, n, H200, None, x_bytes, x_bytes)
    block_n = launch.triton.next_power_of_2(n)
    got = (
        "whole"
        if not p.fwd_two_pass
        else "one chunk"
        if p.block_n == n == block_n and n * x_bytes == 16384
        else "quarter rows"
        if (p.block_n, p.fwd_warps) == launch.looped_forward_chunk(block_n)
        else "chunked"
    )
    assert got == kind, p
    assert p.looped == (n > launch.ROW_LIMIT)
    if p.fwd_two_pass:
        assert (p.fwd_programs, p.fwd_block_m) == (1000, 1)


def test_rows_off_a_16_byte_boundary_get_persistent_whole_row_programs():
    for n in (4097, 5000):  # rule 1b needs 16-byte vectors
        p = launch.plan(8192, n, H200, 1, 2, 2)
        assert not p.fwd_two_pass and (p.block_n, p.fwd_programs, p.fwd_stages) == (8192, 2 * 132, 2)
    aligned = launch.plan(4096, 1024, H200, None, 2, 2)
    assert (aligned.fwd_programs, aligned.fwd_stages) == (4096 // 2, 1)  # one program per 2-row tile


@pytest.mark.parametrize(
    "block_n, x_bytes, expected",
    [
        (1024, 2, (8, 4)),  # 16 KiB of x a tile; 4 warps span a row with one 16-byte vector a thread
        (2048, 2, (4, 8)),
        (8192, 2, (1, 8)),  # 8 warps at most
        (1024, 4, (4, 8)),
        (4096, 4, (1, 8)),
        (64, 4, (16, 1)),  # 16 rows at most
    ],
)
def test_whole_row_backward_tiles_follow_rule_2(block_n, x_bytes, expected):
    assert launch.backward_tile(block_n, x_bytes) == expected


def test_a_small_problem_runs_one_backward_program_that_writes_dgamma_itself():
    p = launch.plan(128, 257, H200, None, 4, 4)
    assert p.partial_rows == 0 and p.bwd_grid == (1, 1)


@pytest.mark.parametrize("n", [1, 257, 4096, 8192, 8193, 32768, MAX_N])
def test_dgamma_partials_are_bounded_by_the_gpu_not_by_the_rows(n):
    """The backward's float64 partials hold P rows of N, P at most 2 per multiprocessor, for any M."""
    rows = [launch.plan(m, n, H200, None, 2, 2).partial_rows for m in (10**5, 10**6, 10**8)]
    assert rows[0] == rows[1] == rows[2]
    assert 1 <= rows[0] <= 2 * H200.sms


@pytest.mark.parametrize("x_bytes, gamma_bytes", [(4, 4), (2, 4), (2, 2)], ids=["float32", "mixed", "half"])
def test_pipeline_stages_shrink_to_fit_the_gpu_s_shared_memory(x_bytes, gamma_bytes):
    """Triton keeps stages - 1 copies of an iteration's pipelined loads in shared memory, and a launch that
    asks for more than the GPU has fails. The plan must never ask for more, on a GPU with much (227 KiB)
    or little (48 KiB)."""
    for gpu in (H200, SMALL_SMEM):
        usable = gpu.smem_bytes - launch.SMEM_RESERVE_BYTES
        for rows, n in [(1, 65536), (4096, 32768), (4096, 8192), (16384, 4096), (8192, 4097), (8192, 5120)]:
            for vec in (None, 1):
                p = launch.plan(rows, n, gpu, vec, x_bytes, gamma_bytes)
                fwd = p.fwd_block_m * p.block_n * x_bytes
                if p.looped:
                    bwd = max(
                        launch.STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * p.bwd_block_m * p.bwd_block_n * x_bytes
                    )
                else:
                    bwd = 2 * p.bwd_block_m * p.bwd_block_n * x_bytes
                assert (p.fwd_stages - 1) * fwd <= usable and (p.bwd_stages - 1) * bwd <= usable, (rows, n, vec, p)
    # and with room to spare, the configured depth is kept
    assert launch.plan(16384, 4096, H200, None, 4, 4).bwd_stages == launch.BWD_STAGES


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
