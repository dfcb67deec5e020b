"""Launch plans: the stated rules give the expected settings, fit the GPU, and bound the dgamma partials."""

import pytest

from rmsnorm_kernel.ops import launch
from rmsnorm_kernel.ops.contract import MAX_N

H200 = dict(sms=132, smem=227 * 1024)


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, (16, 1, 1)),  # 16 rows of one lane share a tile
        (64, (16, 2, 2)),
        (257, (4, 4, 4)),  # BLOCK_N 512: 4 rows make a 2048-element tile
        (2048, (1, 4, 8)),  # one row per tile: the backward gets BLOCK_N / 256 warps
        (4096, (1, 8, 16)),
        (8192, (1, 8, 16)),  # 16 warps at most
    ],
)
def test_whole_row_tiles_follow_the_rules(n, expected):
    assert launch.whole_row_tile(launch.triton.next_power_of_2(n)) == expected


@pytest.mark.parametrize("n, expected", [(8193, (4096, 16)), (32768, (8192, 32)), (65536, (32768, 32))])
def test_looped_forward_chunks_follow_the_rules(n, expected):
    assert launch.looped_forward_chunk(launch.triton.next_power_of_2(n)) == expected


def test_aligned_rows_get_one_forward_program_per_tile_and_unaligned_ones_persistent_programs():
    aligned = launch.plan(4096, 4096, H200["sms"], None, 2, 2, H200["smem"])
    unaligned = launch.plan(8192, 4097, H200["sms"], 1, 2, 2, H200["smem"])
    assert (aligned.fwd_programs, aligned.fwd_stages) == (4096, 1)
    assert (unaligned.fwd_programs, unaligned.fwd_stages) == (2 * 132, 2)


def test_a_small_problem_runs_one_backward_program_that_writes_dgamma_itself():
    p = launch.plan(128, 257, H200["sms"], None, 4, 4, H200["smem"])
    assert p.partial_rows == 0 and p.bwd_grid == (1, 1)


@pytest.mark.parametrize("n", [1, 257, 4096, 8192, 8193, 32768, MAX_N])
def test_dgamma_partials_are_bounded_by_the_gpu_not_by_the_rows(n):
    """The backward's float64 partials hold P rows of N, P at most 2 per multiprocessor, for any M."""
    rows = [launch.plan(m, n, H200["sms"], None, 2, 2, H200["smem"]).partial_rows for m in (10**5, 10**6, 10**8)]
    assert rows[0] == rows[1] == rows[2]
    assert 1 <= rows[0] <= 2 * H200["sms"]


@pytest.mark.parametrize("x_bytes, gamma_bytes", [(4, 4), (2, 4), (2, 2)], ids=["float32", "mixed", "half"])
def test_pipeline_stages_shrink_to_fit_the_gpu_s_shared_memory(x_bytes, gamma_bytes):
    """Triton keeps stages - 1 copies of an iteration's pipelined loads in shared memory, and a launch that
    asks for more than the GPU has fails. The plan must never ask for more, on a GPU with much (227 KiB)
    or little (48 KiB)."""
    for smem in (227 * 1024, 48 * 1024):
        usable = smem - launch.SMEM_RESERVE_BYTES
        for rows, n in [(1, 65536), (4096, 32768), (4096, 8192), (16384, 4096), (8192, 4097)]:
            for aligned in (None, 1):
                p = launch.plan(rows, n, 132, aligned, x_bytes, gamma_bytes, smem)
                if p.looped:
                    fwd = p.block_n * (x_bytes + gamma_bytes)
                    bwd = max(launch.STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * p.bwd_block_m * p.bwd_block_n * x_bytes)
                else:
                    fwd = p.fwd_block_m * p.block_n * x_bytes
                    bwd = 2 * p.bwd_block_m * p.bwd_block_n * x_bytes
                assert (p.fwd_stages - 1) * fwd <= usable and (p.bwd_stages - 1) * bwd <= usable, (rows, n, aligned, p)
    # and with room to spare, the configured depth is kept
    assert launch.plan(16384, 4096, 132, None, 4, 4, 227 * 1024).bwd_stages == launch.BWD_STAGES


@pytest.mark.parametrize("n, x_bytes", [(4096, 4), (8192, 2)], ids=["4096-float32", "8192-half"])
def test_aligned_rows_of_16_kib_take_the_two_pass_forward_in_one_chunk(n, x_bytes):
    p = launch.plan(5, n, H200["sms"], None, x_bytes, x_bytes, H200["smem"])
    assert p.fwd_two_pass and not p.looped and (p.block_n, p.fwd_programs, p.fwd_warps) == (n, 5, 8)
    assert not launch.plan(5, n, H200["sms"], 1, x_bytes, x_bytes, H200["smem"]).fwd_two_pass
    assert not launch.plan(5, n // 2, H200["sms"], None, x_bytes, x_bytes, H200["smem"]).fwd_two_pass  # 8 KiB rows
