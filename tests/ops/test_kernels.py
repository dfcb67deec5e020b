"""The Triton kernels against the oracle: y, dx and dgamma over irregular shapes, three dtypes and the
row layouts the contract accepts."""

import dataclasses
import math

import pytest
import torch
import triton

from rmsnorm_kernel import call_counts, oracle, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import kernels, launch, launchers, looped_kernels
from rmsnorm_kernel.ops.reference import add_oracle, manual_backward
from rmsnorm_kernel.ops.tolerances import TOLERANCES, compare, tolerance_dtype
from rmsnorm_kernel.testing import make_inputs
from tests.helpers import launch_checking_parameters

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F32, F16, BF16 = DTYPES
# Whole rows: N of 1, around a power of two, and past one; M of 1, 17 (not a tile multiple) and 128;
# rows of 16 KB (16-bit N = 8192).
SHAPES = [
    (1, 1),
    (17, 7),
    (128, 255),
    (17, 256),
    (1, 257),
    (128, 257),
    (17, 1000),
    (17, 4096),
    (3, 8192),
    (2, 5, 257),
    (3, 4, 1, 64),
]
# Rows the forward walks in chunks: N a multiple of the chunk, and not.
CHUNKED_SHAPES = [(5, 3072), (17, 3000)]
# Rows longer than launch.ROW_LIMIT take the looped kernels or, where launch.reread_rows says so (16-bit
# 16384, float32 8704), whole rows read twice; N = 65536 is the contract's limit.
LONG_SHAPES = [(3, 8193), (2, 8704), (2, 16384), (2, 20000), (3, 65536)]

# The default tier runs these cases of the three grids above: each forward branch (but the residual's)
# and each backward branch in each dtype (asserted below), and the edges of the shapes once. The rest of
# each grid runs with -m slow.
DEFAULT_SHAPES = {
    ((1, 1), F32),
    ((17, 7), BF16),
    ((128, 255), F16),
    ((17, 256), F32),
    ((17, 256), F16),
    ((17, 1000), BF16),
    ((128, 257), F32),
    ((128, 257), F16),
    ((128, 257), BF16),
    ((17, 4096), F32),
    ((3, 8192), F16),
    ((3, 8192), BF16),
    ((2, 5, 257), F32),
    ((3, 4, 1, 64), BF16),
}
DEFAULT_CHUNKED = {((5, 3072), BF16), ((17, 3000), F32), ((17, 3000), F16)}
DEFAULT_LONG = {
    ((3, 8193), F32),
    ((2, 8704), F32),
    ((3, 8193), F16),
    ((3, 8193), BF16),
    ((2, 16384), F32),
    ((2, 16384), F16),
    ((2, 16384), BF16),
    ((2, 20000), BF16),
    ((3, 65536), BF16),
}


def grid(cases, default):
    """``cases`` as parameters: those in ``default`` run in the default tier, the others with -m slow."""
    return [pytest.param(*case, marks=() if case in default else pytest.mark.slow) for case in cases]


def triton_grads(x, gamma, dy, activation=None, mode="torch"):
    """(y, dx, dgamma) of the Triton path through autograd, from fresh leaves."""
    xl = x.detach().clone().requires_grad_()
    gl = gamma.detach().clone().requires_grad_()
    y = rmsnorm(xl, gl, activation=activation, mode=mode)
    y.backward(dy.to(y.dtype))
    return y.detach(), xl.grad, gl.grad


def assert_matches_oracle(x, gamma, dy, dgamma_dtype=None, activation=None, mode="torch"):
    got = triton_grads(x, gamma, dy, activation, mode)
    want_all = oracle(x, gamma, dy, activation=activation, mode=mode)
    for name, g, want in zip(("y", "dx", "dgamma"), got, want_all):
        assert g.dtype == want.dtype and g.shape == want.shape, name
        dtype = dgamma_dtype if name == "dgamma" and dgamma_dtype else tolerance_dtype(want.dtype, x.dtype, mode)
        c = compare(g, want, dtype)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"
    return got


@pytest.mark.parametrize("shape, dtype", grid([(s, d) for s in SHAPES for d in DTYPES], DEFAULT_SHAPES), ids=str)
def test_triton_matches_oracle_forward_dx_and_dgamma(shape, dtype, device):
    assert_matches_oracle(*make_inputs(shape, dtype, device))


@pytest.mark.parametrize(
    "shape, dtype", grid([(s, d) for s in CHUNKED_SHAPES for d in DTYPES], DEFAULT_CHUNKED), ids=str
)
def test_rows_the_forward_walks_in_chunks_match_oracle(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    p = launch.plan_for(x, gamma)
    assert p.fwd_branch == "chunks" and not p.looped and (shape[1] % p.block_n == 0) == (shape[1] == 3072)
    assert_matches_oracle(x, gamma, dy)


@pytest.mark.parametrize("shape, dtype", grid([(s, d) for s in LONG_SHAPES for d in DTYPES], DEFAULT_LONG), ids=str)
def test_long_rows_match_oracle_forward_dx_and_dgamma(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    assert launch.plan_for(x, gamma).bwd_branch in ("looped", "reread_rows")
    assert_matches_oracle(x, gamma, dy)


def test_the_default_cases_take_every_branch_in_every_dtype():
    """Planned as under the interpreter (on the CPU, whatever the machine): every forward branch but the
    residual's, each backward branch, and the backward's dgamma summed per tile element (16-bit x)."""
    taken = set()
    for shape, dtype in DEFAULT_SHAPES | DEFAULT_CHUNKED | DEFAULT_LONG:
        x, gamma, _ = make_inputs(shape, dtype, "cpu")
        p = launch.plan_for(x.reshape(-1, shape[-1]), gamma)
        rowwise = "_rowwise_dgamma" if p.bwd_rowwise_dgamma else ""
        pieces = "_in_two_pieces" if p.bwd_block_n2 else ""
        taken |= {(p.fwd_branch, dtype), (p.bwd_branch + rowwise, dtype), (p.bwd_branch + pieces, dtype)}
    forward = [b for b in launch.FORWARD_BRANCHES if b != "residual_wide_rows"]  # the residual test's
    want = {(b, d) for b in [*forward, *launch.BACKWARD_BRANCHES, "whole_rows_in_two_pieces"] for d in DTYPES}
    assert want | {("whole_rows_rowwise_dgamma", F16), ("whole_rows_rowwise_dgamma", BF16)} <= taken


# Shapes that between them take every branch of each direction (asserted below).
BRANCH_CASES = [
    ((1, 1), torch.float32),
    ((128, 256), torch.float32),
    ((17, 257), torch.bfloat16),
    ((128, 1000), torch.float32),
    ((5, 4096), torch.float32),
    ((17, 3000), torch.bfloat16),
    ((3, 8193), torch.float32),
    ((2, 8704), torch.float32),
    ((2, 16384), torch.bfloat16),
    ((2, 20000), torch.bfloat16),
]
# Of those, the default tier runs the SiLU, the numerics modes and the residual add on these, which run
# every kernel (asserted below), the backward of rows read twice in one piece (16384) and in two (8704);
# with a residual, also on (2, 16384), its own branch.
KERNEL_CASES = {((17, 257), BF16), ((17, 3000), BF16), ((3, 8193), F32), ((2, 8704), F32), ((2, 16384), BF16)}


@pytest.mark.parametrize("shape, dtype", grid(BRANCH_CASES, KERNEL_CASES), ids=str)
def test_norm_then_silu_matches_oracle(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    y, _, _ = assert_matches_oracle(x, gamma, dy, activation="silu")
    # and it is not the plain norm: SiLU moved the outputs (silu(y) = y only at y = 0)
    assert not compare(y, oracle(x, gamma, dy)[0]).ok


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_launchers_pass_each_kernel_its_own_parameters_only_in_every_branch(residual, device):
    for shape, dtype in BRANCH_CASES:
        x, gamma, dy = make_inputs(shape, dtype, device)
        r = x.flip(0) if residual else None
        out = launchers.rmsnorm_forward(x, gamma, 1e-6, launch=launch_checking_parameters, residual=r)
        h = out[1] if residual else x
        launchers.rmsnorm_backward(dy, h, gamma, 1e-6, launch=launch_checking_parameters, dh=dy if residual else None)


def test_branch_cases_take_every_branch_of_each_direction(device):
    plans = [
        launch.plan_for(*make_inputs(shape, dtype, device)[:2], residual=residual)
        for shape, dtype in BRANCH_CASES
        for residual in (False, True)
    ]
    assert {p.fwd_branch for p in plans} == set(launch.FORWARD_BRANCHES)
    assert {p.bwd_branch for p in plans} == set(launch.BACKWARD_BRANCHES)


def test_kernel_cases_run_every_kernel_of_each_direction(device):
    plans = [launch.plan_for(*make_inputs(shape, dtype, device)[:2]) for shape, dtype in KERNEL_CASES]
    assert {p.fwd_two_pass for p in plans} == {False, True}  # the whole-row and the chunked forward kernel
    assert {p.bwd_branch for p in plans} == set(launch.BACKWARD_BRANCHES)  # whole rows, read once or twice; looped


@pytest.mark.parametrize(
    "shape, dtype, mode",
    grid(
        [(s, d, m) for s, d in BRANCH_CASES for m in ("llama", "gemma")],
        {(*c, m) for c in KERNEL_CASES for m in ("llama", "gemma")},
    ),
    ids=str,
)
def test_numerics_modes_match_their_oracle_in_every_branch(shape, dtype, mode, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    if mode == "gemma":
        gamma = gamma - 1  # Gemma's weights are offsets from 1: the same scale as the other modes
    y, _, _ = assert_matches_oracle(x, gamma, dy, mode=mode)
    assert y.dtype == dtype


@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_numerics_modes_with_silu_match_their_oracle(mode, device):
    x, gamma, dy = make_inputs((3, 8193), torch.bfloat16, device)  # the looped backward: silu in two kernels
    assert_matches_oracle(x, gamma, dy, activation="silu", mode=mode)
    x, gamma, dy = make_inputs((17, 257), torch.bfloat16, device)
    assert_matches_oracle(x, gamma, dy, activation="silu", mode=mode)
    x, gamma, dy = make_inputs((2, 8704), torch.float32, device)  # rows read twice, in two pieces
    assert_matches_oracle(x, gamma, dy, activation="silu", mode=mode)


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_llama_mode_with_a_float32_weight_gives_float32_y_as_type_promotion_does(x_dtype, device):
    x, gamma, dy = make_inputs((17, 257), x_dtype, device, gamma_dtype=torch.float32)
    y, dx, dgamma = assert_matches_oracle(x, gamma, dy.float(), mode="llama")
    assert (y.dtype, dx.dtype, dgamma.dtype) == (torch.float32, x_dtype, torch.float32)


def test_llama_mode_rounds_the_normalized_x_before_the_weight(device):
    # n = x / rms(x) = [1.9022, 0.5944, 0.1189, 0.1189]; bfloat16(n) * 3 and bfloat16(n * 3) differ in three
    # places (values from torch: LlamaRMSNorm's expression and F.rms_norm's)
    x = torch.tensor([[16.0, 5.0, 1.0, 1.0]], device=device, dtype=torch.bfloat16)
    gamma = torch.full((4,), 3.0, device=device, dtype=torch.bfloat16)
    llama = torch.tensor([[5.6875, 1.78125, 0.35546875, 0.35546875]], dtype=torch.bfloat16)
    torch_mode = torch.tensor([[5.71875, 1.78125, 0.357421875, 0.357421875]], dtype=torch.bfloat16)
    assert torch.equal(rmsnorm(x, gamma, mode="llama").cpu(), llama)
    assert torch.equal(rmsnorm(x, gamma).cpu(), torch_mode)


def test_norm_then_silu_counts_one_call_each_way(device):
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    before = dict(call_counts())
    triton_grads(x, gamma, dy, "silu")
    after = call_counts()
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (1, 1)


MIXED_PAIRS = [(a, b) for a in DTYPES for b in DTYPES if a != b]


@pytest.mark.parametrize("x_dtype, gamma_dtype", MIXED_PAIRS, ids=str)
def test_every_mixed_pair_keeps_x_dtype_for_y_and_gamma_dtype_for_dgamma(x_dtype, gamma_dtype, device):
    """As F.rms_norm takes them: any two of the dtypes (autocast's half x with a float32 weight among them)."""
    x, gamma, dy = make_inputs((17, 257), x_dtype, device, gamma_dtype=gamma_dtype)
    # dgamma carries the coarser of the two precisions: judged at it
    coarser = max(x_dtype, gamma_dtype, key=lambda d: TOLERANCES[d].rtol)
    y, dx, dgamma = assert_matches_oracle(x, gamma, dy, dgamma_dtype=coarser)
    assert y.dtype == dx.dtype == x_dtype and dgamma.dtype == gamma_dtype


def test_triton_matches_hand_worked_numbers(device):
    x = torch.tensor([[3.0, 4.0]], device=device, requires_grad=True)
    y = rmsnorm(x, torch.tensor([1.0, 1.0], device=device))
    torch.testing.assert_close(y.detach().cpu(), torch.tensor([[0.848528, 1.131371]]), atol=1e-6, rtol=0)
    y.backward(torch.tensor([[1.0, 2.0]], device=device))
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([[-0.090510, 0.067882]]), atol=1e-6, rtol=0)
    y2 = rmsnorm(x.detach(), torch.tensor([2.0, 0.5], device=device))
    torch.testing.assert_close(y2.cpu(), torch.tensor([[1.697056, 0.565685]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((128, 1000), torch.float32),
        ((40, 4096), torch.float32),
        ((9, 9000), torch.float32),
        ((300, 96), torch.bfloat16),
    ],
    ids=str,
)
def test_backward_with_dgamma_partials_is_bitwise_deterministic(shape, dtype, device):
    """The last: narrow 16-bit rows, dgamma summed per tile element (``Plan.bwd_rowwise_dgamma``)."""
    x, gamma, dy = make_inputs(shape, dtype, device)
    assert launch.plan_for(x, gamma).partial_rows >= 1  # the two-pass dgamma reduction runs
    first, second = triton_grads(x, gamma, dy), triton_grads(x, gamma, dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_float32_dgamma_of_many_narrow_rows_stays_within_float32_tolerance(device):
    """131072 rows of 256: the most rows a narrow sweep point of float32 sums. Float32 running sums per
    tile element (what 16-bit x takes) put this dgamma past float32's tolerance; the float64 sum per tile
    stays within it. (16-bit x: its dgamma rounds to the same values either way at these rows.) The same
    claim at a size the interpreter runs: the test below."""
    x, gamma, dy = make_inputs((131072, 256), torch.float32, device)
    _, dgamma = launchers.rmsnorm_backward(dy, x, gamma, 1e-6)
    c = compare(dgamma, oracle(x, gamma, dy)[2])
    assert c.ok, f"max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"


def test_float32_dgamma_is_summed_across_tiles_in_float64_where_float32_sums_drift(device):
    """Rows whose dgamma terms cancel: the second half repeats the first with dy negated (times 16, a
    power of two: exact), so the exact dgamma is 0 while each program's running sum grows over its first
    16 tiles and cancels over its last 16. Four programs of 32 tiles each (the plan for 2
    multiprocessors, on any device). The float64 sum across tiles that float32 x takes lands within
    float32's tolerance of the oracle; float32 running sums per tile element (what 16-bit x takes), on the
    same rows, do not."""
    half, n = 1024, 256
    x, gamma, dy = make_inputs((half, n), torch.float32, device)
    x, dy = torch.cat([x, x]), torch.cat([16 * dy, -16 * dy])
    p = launch.plan(2 * half, n, launch.INTERPRETER)
    assert not p.bwd_rowwise_dgamma and not launch.plan_for(x, gamma).bwd_rowwise_dgamma
    assert triton.cdiv(2 * half, p.bwd_block_m) >= 32 * p.partial_rows
    want = oracle(x, gamma, dy)[2]
    _, dgamma = launchers.rmsnorm_backward(dy, x, gamma, 1e-6, p)
    c = compare(dgamma, want)
    assert c.ok, f"max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"
    _, float32_sums = launchers.rmsnorm_backward(dy, x, gamma, 1e-6, dataclasses.replace(p, bwd_rowwise_dgamma=True))
    assert not compare(float32_sums, want).ok


def test_backward_accepts_a_broadcast_upstream_gradient(device):
    x, gamma, _ = make_inputs((17, 33), torch.float32, device)
    xl = x.clone().requires_grad_()
    rmsnorm(xl, gamma).sum().backward()  # dy is an expanded (stride-0) tensor of ones
    assert compare(xl.grad, oracle(x, gamma, torch.ones_like(x))[1]).ok


def test_rows_off_a_16_byte_boundary_take_persistent_programs_and_match(device):
    """float16 rows of 4097 elements start off 16-byte boundaries: the forward runs fewer, persistent
    programs that loop over the row tiles."""
    rows = 8 * launch.gpu_for(torch.empty(0, device=device)).sms + 3  # more than a persistent grid's programs
    x, gamma, dy = make_inputs((rows, 4097), torch.float16, device)
    p = launch.plan_for(x, gamma)
    assert launch.vector_width(4097, x) == 1 and p.fwd_branch == "whole_rows_persistent" and p.fwd_programs < rows
    assert_matches_oracle(x, gamma, dy)


@pytest.mark.parametrize("n", [16384, 20000], ids=lambda n: f"N={n}")
def test_looped_forward_with_whole_chunks_or_a_partial_last_chunk(n, device):
    """N a multiple of the chunk takes the unmasked loads (EVEN_N), any other N the masked ones."""
    x, gamma, dy = make_inputs((3, n), torch.bfloat16, device)
    p = launch.plan_for(x, gamma)
    assert p.fwd_two_pass and p.fwd_programs == 3 and (n % p.block_n == 0) == (n == 16384)
    assert compare(rmsnorm(x, gamma), oracle(x, gamma, dy)[0]).ok


def test_looped_backward_with_more_rows_than_programs(device):
    """More row tiles than persistent programs, so each program sums several rows into its partial."""
    n = 20000
    gpu = launch.gpu_for(torch.empty(0, device=device))
    big = launch.plan(10**6, n, gpu, None, 2, 2)  # as many programs as the GPU gets at this N
    x, gamma, dy = make_inputs(((big.partial_rows + 1) * big.bwd_block_m, n), torch.float16, device)
    p = launch.plan_for(x, gamma)
    assert p.bwd_branch == "looped" and triton.cdiv(x.shape[0], p.bwd_block_m) > p.bwd_grid[0]
    assert_matches_oracle(x, gamma, dy)


class _LaunchSpy:
    """Stands in for a Triton kernel and records the arguments it is launched with."""

    def __init__(self, kernel):
        self.kernel, self.calls, self.constants = kernel, [], []

    def __getitem__(self, grid):
        def launch_(*args, **kwargs):
            self.calls.append(args)
            self.constants.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch_


@pytest.mark.parametrize("n", [257, 9000], ids=lambda n: f"N={n}")
def test_rows_of_a_wider_tensor_are_read_in_place(n, device, monkeypatch):
    """x[:, :N] of a wider tensor: the kernels get x's own storage and row stride, no copy."""
    wide, gamma, _ = make_inputs((6, n + 100), torch.float32, device)
    gamma = gamma[:n].contiguous()
    dy = make_inputs((6, n), torch.float32, device, seed=1)[2]
    x = wide[:, :n]
    assert not x.is_contiguous()
    p = launch.plan_for(x, gamma)
    fwd_name = "_rmsnorm_fwd_chunked_kernel" if p.fwd_two_pass else "_rmsnorm_fwd_kernel"
    bwd_name = {
        "looped": "_rmsnorm_bwd_row_stats_kernel",
        "reread_rows": "_rmsnorm_bwd_reread_kernel",
        "whole_rows": "_rmsnorm_bwd_kernel",
    }[p.bwd_branch]
    bwd_module = looped_kernels if p.looped else kernels
    spies = {name: _LaunchSpy(getattr(m, name)) for m, name in ((kernels, fwd_name), (bwd_module, bwd_name))}
    monkeypatch.setattr(kernels, fwd_name, spies[fwd_name])
    monkeypatch.setattr(bwd_module, bwd_name, spies[bwd_name])
    wide_leaf, gl = wide.clone().requires_grad_(), gamma.clone().requires_grad_()
    x_leaf = wide_leaf[:, :n]  # the slice is what rmsnorm sees; autograd routes dx back into wide's grad
    y = rmsnorm(x_leaf, gl)
    y.backward(dy)
    for spy in spies.values():
        launched_x = [a for a in spy.calls[0] if isinstance(a, torch.Tensor) and a.data_ptr() == wide_leaf.data_ptr()]
        # x itself; without a residual the forward also passes it as the norm's input (and the unread residual)
        assert launched_x and all(a.stride() == (n + 100, 1) for a in launched_x)
    y_ref, dx_ref, dgamma_ref = oracle(x, gamma, dy)
    assert torch.equal(wide_leaf.grad[:, n:], torch.zeros_like(wide_leaf.grad[:, n:]))
    assert compare(y, y_ref).ok and compare(wide_leaf.grad[:, :n], dx_ref).ok and compare(gl.grad, dgamma_ref).ok
    assert y.is_contiguous()


def test_kernels_are_told_the_vector_width_every_row_of_x_and_dy_allows(device, monkeypatch):
    """VEC promises the compiler that N and the row strides are multiples of it: the launcher must pass
    the width of the narrowest tensor (here dy's rows, 1002 elements apart: 2), and the results match."""
    n = 1000
    wide_x, gamma, _ = make_inputs((6, 1004), torch.bfloat16, device)
    wide_dy = make_inputs((6, 1002), torch.bfloat16, device, seed=1)[0]
    x, dy, gamma = wide_x[:, :n], wide_dy[:, :n], gamma[:n].contiguous()
    spies = {name: _LaunchSpy(getattr(kernels, name)) for name in ("_rmsnorm_fwd_kernel", "_rmsnorm_bwd_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(kernels, name, spy)
    y = launchers.rmsnorm_forward(x, gamma, 1e-6)
    dx, dgamma = launchers.rmsnorm_backward(dy, x, gamma, 1e-6)
    assert spies["_rmsnorm_fwd_kernel"].constants[0]["VEC"] == 4  # x's rows are 1004 elements apart
    assert spies["_rmsnorm_bwd_kernel"].constants[0]["VEC"] == 2
    for got, want in zip((y, dx, dgamma), oracle(x, gamma, dy)):
        assert compare(got, want).ok


@pytest.mark.parametrize(
    "shape, dtype", [((6, 8), torch.float32), ((6, 1000), torch.bfloat16), ((6, 3000), torch.bfloat16)], ids=str
)
def test_a_saved_x_handed_back_in_another_layout_is_read_at_its_own_vector_width(shape, dtype, device):
    """Saved-tensor hooks (offloading, compression) may give the backward x at another row stride than
    the forward planned for: here 1 element wider, so no vector of 2 or more fits. The backward must take
    VEC from the x it reads, or every row after the first is read at the wrong address."""
    n = shape[1]
    x, gamma, dy = make_inputs(shape, dtype, device)

    def unpack(t):
        if t.shape == x.shape:  # x: a copy inside a wider buffer, rows n + 1 apart
            wide = torch.zeros(t.shape[0], n + 1, dtype=t.dtype, device=t.device)
            wide[:, :n] = t
            return wide[:, :n]
        return t

    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = rmsnorm(xl, gl)
    y.backward(dy)
    for name, got, want in zip(("y", "dx", "dgamma"), (y.detach(), xl.grad, gl.grad), oracle(x, gamma, dy)):
        assert compare(got, want).ok, name


def test_a_plan_made_for_another_layout_still_launches_at_the_given_tensors_vector_width(device, monkeypatch):
    spy = _LaunchSpy(kernels._rmsnorm_fwd_kernel)
    monkeypatch.setattr(kernels, "_rmsnorm_fwd_kernel", spy)
    x, gamma, dy = make_inputs((6, 1000), torch.bfloat16, device)
    p = launch.plan_for(x, gamma)  # contiguous rows: 8 elements a load
    wide = torch.zeros(6, 1001, dtype=x.dtype, device=x.device)
    wide[:, :1000] = x
    y = launchers.rmsnorm_forward(wide[:, :1000], gamma, 1e-6, p)
    assert p.vec == 8 and spy.constants[0]["VEC"] == 1
    assert compare(y, oracle(x, gamma, dy)[0]).ok


STRIDED = {
    # (how x is taken from a contiguous tensor, the shape that tensor has)
    "transposed": (lambda t: t.t(), (40, 6)),
    "every_other_column": (lambda t: t[:, ::2], (6, 80)),
    "rows_at_two_strides": (lambda t: t[:, :3, :], (4, 6, 40)),
    "qk_after_transpose": (lambda t: t.view(2, 5, 3, 40).transpose(1, 2), (2, 5, 120)),
}


@pytest.mark.parametrize("name", STRIDED)
def test_any_strides_give_the_oracles_result(name, device):
    """Layouts that no single row stride reaches (as F.rms_norm takes them): the same result as the
    contiguous x, gradients in x's own shape."""
    take, base_shape = STRIDED[name]
    base, _, _ = make_inputs(base_shape, torch.float32, device)
    x = take(base)
    assert not launchers.rows_at_one_stride(x)
    n = x.shape[-1]
    gamma = make_inputs((1, n), torch.float32, device, seed=2)[0][0].contiguous()
    dy = make_inputs(tuple(x.shape), torch.float32, device, seed=3)[0]
    gl = gamma.clone().requires_grad_()
    xs = take(base.detach().clone()).requires_grad_()  # the strided layout itself, a leaf
    y = rmsnorm(xs, gl)
    dx, dgamma = torch.autograd.grad(y, (xs, gl), dy)
    assert dx.shape == xs.shape
    for got, want in zip((y, dx, dgamma), oracle(x.contiguous(), gamma, dy)):
        assert compare(got, want).ok, name


def test_a_non_contiguous_gamma_is_read_through_a_copy(device):
    x, gamma, dy = make_inputs((5, 33), torch.float32, device)
    pairs = torch.stack([gamma, torch.zeros_like(gamma)], dim=1).requires_grad_()
    strided = pairs[:, 0]  # every other element of a leaf
    assert not strided.is_contiguous()
    y = rmsnorm(x, strided)
    (dgamma,) = torch.autograd.grad(y, pairs, dy)
    want_y, _, want_dgamma = oracle(x, gamma, dy)
    assert compare(y, want_y).ok and compare(dgamma[:, 0], want_dgamma).ok
    assert torch.equal(dgamma[:, 1], torch.zeros_like(gamma))


def test_rows_at_one_stride_reads_slices_and_contiguous_tensors_in_place(device):
    base, _, _ = make_inputs((4, 6, 40), torch.float32, device)
    assert launchers.rows_at_one_stride(base) and launchers.rows_at_one_stride(base[..., :33])
    assert launchers.rows_at_one_stride(base[1:3]) and launchers.rows_at_one_stride(base[:, 2])
    assert launchers.as_rows(base[..., :33], 33).data_ptr() == base.data_ptr()  # a view, no copy


def test_three_dimensional_slice_with_one_row_stride(device):
    base, gamma, dy = make_inputs((2, 3, 300), torch.float32, device)
    x = base[:, :, :257]  # strides (900, 300, 1): rows 300 apart throughout
    assert_matches_oracle(x, gamma[:257].contiguous(), dy[:, :, :257].contiguous())


def test_broadcast_rows_of_stride_zero(device):
    row, gamma, _ = make_inputs((1, 257), torch.float32, device)
    x = row.expand(5, 257)  # every row is the same memory
    dy = make_inputs((5, 257), torch.float32, device, seed=3)[2]
    assert_matches_oracle(x, gamma, dy)


@pytest.mark.parametrize("n", [33, 9000], ids=["whole-row", "looped"])
def test_launchers_return_empty_y_and_dx_and_zero_dgamma_for_x_without_rows_without_launching(n, device):
    """Nothing to compute, so nothing launched (a zero-size grid is an error in some Triton versions), and"""
    from rmsnorm_kernel.testing import kernel_launches_forbidden

    x = torch.randn(3, 0, n, device=device, dtype=torch.bfloat16)
    dy = torch.randn(3, 0, n, device=device, dtype=torch.bfloat16)
    gamma = torch.full((n,), 2.0, device=device)  # float32: the mixed-precision pair
    with kernel_launches_forbidden():
        y = launchers.rmsnorm_forward(x, gamma, 1e-6)
        dx, dgamma = launchers.rmsnorm_backward(dy, x, gamma, 1e-6)
    assert (y.shape, y.dtype, dx.shape, dx.dtype) == (x.shape, x.dtype, x.shape, x.dtype)
    assert dgamma.dtype == torch.float32 and torch.equal(dgamma, torch.zeros(n, device=device))


@pytest.mark.gpu
def test_tensor_over_2_31_elements(device):
    """64-bit row offsets: the last rows of a (32769, 65536) bfloat16 tensor lie past element 2**31."""
    m, n = 2**31 // 65536 + 1, 65536
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=g)
    gamma = 1.0 + 0.5 * torch.randn(n, device=device, generator=g)  # float32: dgamma judged as in the mixed test
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=g)
    assert x.numel() > 2**31
    xl, gl = x.requires_grad_(), gamma.requires_grad_()
    y = rmsnorm(xl, gl)
    y.backward(dy)
    with torch.no_grad():
        for rows in (slice(0, 2), slice(m - 2, m)):  # the far end is where 32-bit offsets would wrap
            assert compare(y[rows], rmsnorm_reference(x[rows], gamma)).ok
            assert compare(xl.grad[rows], manual_backward(x[rows], gamma, dy[rows])[0]).ok
        dgamma_ref = torch.zeros(n, device=device, dtype=torch.float32)
        for start in range(0, m, 4096):
            dgamma_ref += manual_backward(x[start : start + 4096], gamma, dy[start : start + 4096])[1]
        assert compare(gl.grad, dgamma_ref, dtype=torch.bfloat16).ok


def test_two_step_row_statistics_give_r_rounded_once_to_float32(device):
    """dgamma sums dy * x * r over every row, so r a few units of float32 off in each row put float32 dgamma
    past its tolerance at 10082 x 13312. The row statistics sum the squares in float64: the r they store
    is within half a unit of float32 of the float64 value."""
    rows, n = 64, 13312
    x, gamma, dy = make_inputs((rows, n), torch.float32, device)
    p = launch.plan_for(x, gamma)
    assert p.looped
    r, coef = torch.empty(rows, device=device), torch.empty(rows, device=device)
    looped_kernels._rmsnorm_bwd_row_stats_kernel[(rows,)](
        dy, x, gamma, r, coef, n, dy.stride(0), x.stride(0), 1e-6,
        BLOCK_N=p.stats_block_n, STAGES=1, VEC=4, SILU=False, ROUND_NORM=False, WEIGHT_OFFSET=False, FP64=False,
    )  # fmt: skip
    want = torch.rsqrt(x.double().pow(2).mean(dim=1) + 1e-6)
    half_unit = (want.float().nextafter(torch.tensor(math.inf, device=device)) - want.float()).double() / 2
    assert ((r.double() - want).abs() <= half_unit * (1 + 1e-6)).all()


def test_the_named_kernels_of_each_direction_are_the_kernels_modules_define():
    names = launchers.FORWARD_KERNELS + launchers.BACKWARD_KERNELS
    modules = (kernels, looped_kernels)
    defined = {n for m in modules for n in vars(m) if n.startswith("_") and n.endswith("_kernel")}
    assert set(names) == defined
    assert all(any(hasattr(getattr(m, n, None), "run") for m in modules) for n in names)


def residual_grads(x, residual, gamma, dy, dh, **kwargs):
    """(y, h, dx, dresidual, dgamma) of the Triton path with a residual, through autograd."""
    xl, rl, gl = (t.detach().clone().requires_grad_() for t in (x, residual, gamma))
    y, h = rmsnorm(xl, gl, residual=rl, **kwargs)
    torch.autograd.backward([y, h], [dy.to(y.dtype), dh.to(h.dtype)])
    return y.detach(), h.detach(), xl.grad, rl.grad, gl.grad


def assert_residual_matches_oracle(x, residual, gamma, dy, dh, mode="torch", **kwargs):
    got = residual_grads(x, residual, gamma, dy, dh, mode=mode, **kwargs)
    want_all = add_oracle(x, residual, gamma, dy.to(got[0].dtype), dh.to(got[1].dtype), mode=mode, **kwargs)
    for name, g, want in zip(("y", "h", "dx", "dresidual", "dgamma"), got, want_all):
        assert g.dtype == want.dtype and g.shape == want.shape, name
        c = compare(g, want, tolerance_dtype(want.dtype, got[1].dtype, mode))
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, {c.worst_over_tol:.3g} x the tolerance"
    return got


@pytest.mark.parametrize(
    "shape, dtype, h",
    grid(
        [(s, d, h) for s, d in BRANCH_CASES for h in ("h_in_x_dtype", "h_in_fp32")],
        {(*c, h) for c in [*KERNEL_CASES, ((2, 16384), BF16)] for h in ("h_in_x_dtype", "h_in_fp32")},
    ),
    ids=str,
)
def test_residual_add_matches_its_oracle_in_every_branch(shape, dtype, h, device):
    residual_in_fp32 = h == "h_in_fp32"
    x, gamma, dy = make_inputs(shape, dtype, device)
    residual, _, dh = make_inputs(shape, dtype, device, seed=1)
    _, h, _, _, _ = assert_residual_matches_oracle(x, residual, gamma, dy, dh, residual_in_fp32=residual_in_fp32)
    assert h.dtype == (torch.float32 if residual_in_fp32 else dtype)
    # h is exactly the add torch makes (one rounding of the exact sum)
    assert torch.equal(h, x.to(h.dtype) + residual.to(h.dtype))


def test_residual_add_with_mixed_dtypes_modes_and_silu(device):
    x, gamma, dy = make_inputs((17, 257), torch.bfloat16, device, gamma_dtype=torch.float32)
    residual, _, dh = make_inputs((17, 257), torch.float32, device, seed=1)  # an fp32 residual stream
    got = assert_residual_matches_oracle(x, residual, gamma, dy, dh)
    assert (got[1].dtype, got[2].dtype, got[3].dtype) == (torch.float32, torch.bfloat16, torch.float32)
    x, gamma, dy = make_inputs((3, 8193), torch.bfloat16, device)
    residual, _, dh = make_inputs((3, 8193), torch.bfloat16, device, seed=1)
    assert_residual_matches_oracle(x, residual, gamma, dy, dh, mode="llama", activation="silu")
    assert_residual_matches_oracle(x, residual, gamma - 1, dy, dh, mode="gemma")


def test_residual_add_counts_one_call_each_way_and_needs_only_one_output_used(device):
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    residual = make_inputs((17, 257), torch.float32, device, seed=1)[0]
    before = dict(call_counts())
    for use in ("y", "h"):
        xl, rl, gl = x.clone().requires_grad_(), residual.clone().requires_grad_(), gamma.clone().requires_grad_()
        y, h = rmsnorm(xl, gl, residual=rl)
        (y if use == "y" else h).backward(dy)
        if use == "h":  # h = x + residual: its gradient goes to both unchanged, and none to gamma, as unfused
            assert torch.equal(xl.grad, dy) and torch.equal(rl.grad, dy) and gl.grad is None
    after = call_counts()
    # two forwards; one backward launch: with only h used there is no norm gradient to compute
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (2, 1)


@pytest.mark.parametrize("shape", [(17, 257), (5, 4096), (3, 8193)], ids=str)
def test_float64_is_computed_in_float64_and_matches_the_oracle(shape, device):
    x, gamma, dy = make_inputs(shape, torch.float64, device)
    y, dx, dgamma = assert_matches_oracle(x, gamma, dy)  # float64's tolerance: rtol 1e-8, far below float32's
    assert y.dtype == dx.dtype == dgamma.dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs", [{}, {"activation": "silu"}, {"mode": "llama"}, {"mode": "gemma"}], ids=lambda k: str(k) or "plain"
)
def test_gradcheck_runs_on_the_triton_path_itself(kwargs, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, generator=g).to(device).requires_grad_()
    gamma = (1 + 0.5 * torch.randn(7, dtype=torch.float64, generator=g)).to(device).requires_grad_()
    before = call_counts()["backward"]
    assert torch.autograd.gradcheck(lambda a, b: rmsnorm(a, b, **kwargs), (x, gamma))
    assert call_counts()["backward"] > before  # the analytical gradient came from the kernels


def test_gradcheck_runs_on_the_fused_residual_add(device):
    g = torch.Generator().manual_seed(1)
    x, residual = (torch.randn(3, 7, dtype=torch.float64, generator=g).to(device).requires_grad_() for _ in range(2))
    gamma = (1 + 0.5 * torch.randn(7, dtype=torch.float64, generator=g)).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, r, b: rmsnorm(a, b, residual=r), (x, residual, gamma))
