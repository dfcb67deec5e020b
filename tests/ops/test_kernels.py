"""The Triton kernels against the oracle: y, dx and dgamma over irregular shapes and three dtypes."""

import math

import pytest
import torch

from rmsnorm_kernel import kernels, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.reference import manual_backward
from rmsnorm_kernel.tolerances import compare

from .conftest import DEVICE, make_inputs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NS = [1, 7, 255, 256, 257, 1000, 4096]
MS = [1, 17, 128]
SHAPES = [(m, n) for m in MS for n in NS] + [(2, 5, 257), (3, 4, 1, 64)]


def triton_and_reference(x, gamma, dy):
    """Forward and backward of both paths from the same leaves: ((y, dx, dgamma), (y, dx, dgamma))."""
    results = []
    for fn in (rmsnorm, rmsnorm_reference):
        xl = x.detach().clone().requires_grad_()
        gl = gamma.detach().clone().requires_grad_()
        y = fn(xl, gl)
        y.backward(dy)
        results.append((y.detach(), xl.grad, gl.grad))
    return results


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triton_matches_oracle_forward_dx_and_dgamma(shape, dtype, device):
    x, gamma, dy = make_inputs(shape, dtype, device)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref), ("dgamma", dgamma, dgamma_ref)):
        assert got.dtype == want.dtype == dtype, name
        c = compare(got, want)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mixed_precision_pair_keeps_x_dtype_for_y_and_gamma_dtype_for_dgamma(x_dtype, device):
    x, gamma, dy = make_inputs((17, 257), x_dtype, device, gamma_dtype=torch.float32)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    assert y.dtype == dx.dtype == x_dtype
    assert dgamma.dtype == torch.float32
    assert compare(y, y_ref).ok
    assert compare(dx, dx_ref).ok
    # dgamma is accumulated in float32 from half inputs: judged at x's precision
    assert compare(dgamma, dgamma_ref, dtype=x_dtype).ok


def test_triton_matches_hand_worked_numbers(device):
    x = torch.tensor([[3.0, 4.0]], device=device, requires_grad=True)
    y = rmsnorm(x, torch.tensor([1.0, 1.0], device=device))
    torch.testing.assert_close(y.detach().cpu(), torch.tensor([[0.848528, 1.131371]]), atol=1e-6, rtol=0)
    y.backward(torch.tensor([[1.0, 2.0]], device=device))
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([[-0.090510, 0.067882]]), atol=1e-6, rtol=0)
    y2 = rmsnorm(x.detach(), torch.tensor([2.0, 0.5], device=device))
    torch.testing.assert_close(y2.cpu(), torch.tensor([[1.697056, 0.565685]]), atol=1e-6, rtol=0)


def test_backward_is_bitwise_deterministic(device):
    x, gamma, dy = make_inputs((128, 1000), torch.float32, device)
    first = triton_and_reference(x, gamma, dy)[0]
    second = triton_and_reference(x, gamma, dy)[0]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_backward_accepts_a_broadcast_upstream_gradient(device):
    x, gamma, _ = make_inputs((17, 33), torch.float32, device)
    xl = x.clone().requires_grad_()
    rmsnorm(xl, gamma).sum().backward()  # dy is an expanded (stride-0) tensor of ones
    xr = x.clone().requires_grad_()
    rmsnorm_reference(xr, gamma).sum().backward()
    assert compare(xl.grad, xr.grad).ok


# Rows longer than kernels.ROW_LIMIT take the looped kernels; N = 65536 is the contract's limit.
LONG_SHAPES = [(3, 8193), (2, 20000), (3, 65536)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", LONG_SHAPES, ids=str)
def test_long_rows_match_oracle_forward_dx_and_dgamma(shape, dtype, device):
    assert shape[-1] > kernels.ROW_LIMIT
    x, gamma, dy = make_inputs(shape, dtype, device)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref), ("dgamma", dgamma, dgamma_ref)):
        c = compare(got, want)
        assert c.ok, f"{name}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g} over {c.tolerance}"


@pytest.mark.parametrize("persistent", [0, 2], ids=lambda v: f"forward programs per SM {v}")
def test_forward_matches_oracle_with_one_program_per_tile_or_persistent(persistent, device, monkeypatch):
    """Both forward grids the launch table can choose, for aligned rows and for rows that start off a
    16-byte boundary (N = 4097 in float16)."""
    monkeypatch.setattr(kernels, "FWD_PROGRAMS_PER_SM", persistent)
    monkeypatch.setattr(kernels, "UNALIGNED_FWD_PROGRAMS_PER_SM", persistent)
    kernels.plan.cache_clear()
    tiles = 2 * kernels.sm_count(torch.device(device)) + 3  # more row tiles than 2 programs per SM
    try:
        for shape, dtype in [((4 * tiles, 257), torch.float32), ((16 * tiles, 64), torch.float32), ((tiles, 4097), torch.float16)]:
            x, gamma, _ = make_inputs(shape, dtype, device)
            p = kernels.plan(shape[0], shape[1], kernels.sm_count(x.device), False)
            assert (p.fwd_programs < kernels.triton.cdiv(shape[0], p.fwd_block_m)) == (persistent > 0)  # tiles
            c = compare(kernels.rmsnorm_forward(x, gamma, 1e-6), rmsnorm_reference(x, gamma, 1e-6))
            assert c.ok, f"{shape}: max abs {c.max_abs:.3g} over {c.tolerance}"
    finally:
        kernels.plan.cache_clear()


@pytest.mark.parametrize("n", [16384, 20000], ids=lambda n: f"N={n}")
def test_looped_forward_with_whole_chunks_or_a_partial_last_chunk(n, device):
    """N a multiple of the chunk takes the unmasked loads (EVEN_N), any other N the masked ones."""
    p = kernels.plan(3, n, kernels.sm_count(torch.device(device)))
    assert p.looped and p.fwd_programs == 3 and (n % p.block_n == 0) == (n == 16384)
    x, gamma, _ = make_inputs((3, n), torch.bfloat16, device)
    c = compare(kernels.rmsnorm_forward(x, gamma, 1e-6), rmsnorm_reference(x, gamma, 1e-6))
    assert c.ok, f"max abs {c.max_abs:.3g} over {c.tolerance}"


@pytest.mark.parametrize("n, dtype", [(4096, torch.float32), (8192, torch.bfloat16)], ids=["4096-float32", "8192-bfloat16"])
def test_aligned_rows_of_16_kib_take_the_chunked_forward(n, dtype, device):
    """Aligned 16 KiB rows run the two-pass chunked forward (FWD_CHUNKED_ROWS), one program per row;
    the same rows off a 16-byte boundary (a slice starting one element in) keep the whole-row kernel."""
    x_bytes = torch.empty((), dtype=dtype).element_size()
    sms = kernels.sm_count(torch.device(device))
    p = kernels.plan(5, n, sms, True, x_bytes)
    assert p.fwd_chunked and not p.looped and p.fwd_programs == 5
    assert not kernels.plan(5, n, sms, False, x_bytes).fwd_chunked
    wide, gamma, _ = make_inputs((5, n + 1), dtype, device)
    gamma = gamma[:n].contiguous()
    for x in (wide[:, :n].contiguous(), wide.view(-1)[1:1 + 5 * n].view(5, n)):
        c = compare(kernels.rmsnorm_forward(x, gamma, 1e-6), rmsnorm_reference(x, gamma, 1e-6))
        assert c.ok, f"aligned={kernels.rows_aligned(x)}: max abs {c.max_abs:.3g} over {c.tolerance}"


@pytest.mark.parametrize("x_bytes, gamma_bytes", [(4, 4), (2, 4), (2, 2)], ids=["float32", "mixed", "half"])
def test_pipeline_stages_shrink_to_fit_the_gpu_s_shared_memory(x_bytes, gamma_bytes):
    """Triton keeps stages - 1 copies of an iteration's pipelined loads in shared memory, and a launch that
    asks for more than the GPU has fails (float32 rows of 65536 at 3 stages of a 16384 chunk: 256 KiB on
    an H200). The plan must never ask for more, on a GPU with much (227 KiB) or little (48 KiB)."""
    for smem in (227 * 1024, 48 * 1024):
        usable = smem - kernels.SMEM_RESERVE_BYTES
        for rows, n in [(1, 65536), (4096, 32768), (4096, 8192), (16384, 4096), (8192, 4097)]:
            for aligned in (True, False):
                p = kernels.plan(rows, n, 132, aligned, x_bytes, gamma_bytes, smem)
                if p.looped:
                    fwd = p.block_n * (x_bytes + gamma_bytes)
                    bwd = max(kernels.STATS_BLOCK_N * (2 * x_bytes + gamma_bytes), 2 * p.bwd_block_m * p.bwd_block_n * x_bytes)
                else:
                    fwd = p.fwd_block_m * p.block_n * x_bytes
                    bwd = 2 * p.bwd_block_m * p.bwd_block_n * x_bytes
                assert (p.fwd_stages - 1) * fwd <= usable and (p.bwd_stages - 1) * bwd <= usable, (rows, n, aligned, p)
    # and with room to spare, the configured depth is kept
    assert kernels.plan(16384, 4096, 132, True, 4, 4, 227 * 1024).bwd_stages == kernels.BWD_STAGES


def test_n_65536_with_more_rows_than_programs(device):
    """More row tiles than persistent programs, so each program sums several rows into its partial."""
    n = 65536
    shape = ((kernels.max_dgamma_scratch_rows(n, torch.device(device)) + 1) * kernels.SEG_BLOCK_M, n)
    p = kernels.plan(shape[0], shape[1], kernels.sm_count(torch.device(device)))
    assert p.looped and kernels.triton.cdiv(shape[0], p.bwd_block_m) > p.bwd_grid[0]
    x, gamma, dy = make_inputs(shape, torch.float16, device)
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    assert compare(y, y_ref).ok and compare(dx, dx_ref).ok and compare(dgamma, dgamma_ref).ok


class _LaunchSpy:
    """Stands in for a Triton kernel and records the tensors and strides it is launched with."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(args)
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("n", [257, 9000], ids=lambda n: f"N={n}")
def test_rows_of_a_wider_tensor_are_read_in_place(n, device, monkeypatch):
    """x[:, :N] of a wider tensor: the kernels get x's own storage and row stride, no copy."""
    wide, gamma, _ = make_inputs((6, n + 100), torch.float32, device)
    gamma = gamma[:n].contiguous()
    dy = make_inputs((6, n), torch.float32, device, seed=1)[2]
    x = wide[:, :n]
    assert not x.is_contiguous()
    fwd_name = "_rmsnorm_fwd_chunked_kernel" if kernels.plan_for(x, gamma).fwd_chunked else "_rmsnorm_fwd_kernel"
    bwd_name = "_rmsnorm_bwd_row_stats_kernel" if n > kernels.ROW_LIMIT else "_rmsnorm_bwd_kernel"
    spies = {name: _LaunchSpy(getattr(kernels, name)) for name in (fwd_name, bwd_name)}
    for name, spy in spies.items():
        monkeypatch.setattr(kernels, name, spy)
    wide_leaf, gl = wide.clone().requires_grad_(), gamma.clone().requires_grad_()
    x_leaf = wide_leaf[:, :n]  # the slice is what rmsnorm sees; autograd routes dx back into wide's grad
    y = rmsnorm(x_leaf, gl)
    y.backward(dy)
    for spy in spies.values():
        launched_x = [a for a in spy.calls[0] if isinstance(a, torch.Tensor) and a.data_ptr() == wide_leaf.data_ptr()]
        assert len(launched_x) == 1 and launched_x[0].stride() == (n + 100, 1)
    (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)[1]
    dx, dgamma = wide_leaf.grad[:, :n], gl.grad
    assert torch.equal(wide_leaf.grad[:, n:], torch.zeros_like(wide_leaf.grad[:, n:]))
    assert compare(y, y_ref).ok and compare(dx, dx_ref).ok and compare(dgamma, dgamma_ref).ok
    assert y.is_contiguous() and dx.shape == x.shape


def test_three_dimensional_slice_with_one_row_stride(device):
    base, gamma, dy = make_inputs((2, 3, 300), torch.float32, device)
    x = base[:, :, :257]  # strides (900, 300, 1): rows 300 apart throughout
    gamma, dy = gamma[:257].contiguous(), dy[:, :, :257].contiguous()
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    assert compare(y, y_ref).ok and compare(dx, dx_ref).ok and compare(dgamma, dgamma_ref).ok


def test_broadcast_rows_of_stride_zero(device):
    row, gamma, dy = make_inputs((1, 257), torch.float32, device)
    x = row.expand(5, 257)  # every row is the same memory
    dy = make_inputs((5, 257), torch.float32, device, seed=3)[2]
    (y, dx, dgamma), (y_ref, dx_ref, dgamma_ref) = triton_and_reference(x, gamma, dy)
    assert compare(y, y_ref).ok and compare(dx, dx_ref).ok and compare(dgamma, dgamma_ref).ok


@pytest.mark.parametrize("shape", [(128, 1000), (40, 4096), (9, 9000)], ids=str)
def test_persistent_and_looped_backward_is_bitwise_deterministic(shape, device):
    p = kernels.plan(shape[0], shape[1], kernels.sm_count(torch.device(device)))
    assert p.partial_rows >= 1  # the two-pass dgamma reduction is what this exercises
    x, gamma, dy = make_inputs(shape, torch.float32, device)
    first = triton_and_reference(x, gamma, dy)[0]
    second = triton_and_reference(x, gamma, dy)[0]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU: 2**31 elements are too many for the interpreter")
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


def _code_lines(fn) -> list[str]:
    import inspect
    import re

    src = inspect.getsource(getattr(fn, "fn", fn))
    lines = [re.sub(r"\s+#.*$", "", line).rstrip() for line in src.splitlines()]
    return [line for line in lines[2:] if line.strip() and not line.strip().startswith("#")]  # after decorator, name


def test_mutants_are_the_whole_row_kernels_but_for_the_denominator():
    """mutants.py must stay a copy of the kernels, or its defect no longer says anything about them."""
    from rmsnorm_kernel import mutants

    for kernel, mutant in ((kernels._rmsnorm_fwd_kernel, mutants._rmsnorm_fwd_kernel_block_mean),
                           (kernels._rmsnorm_bwd_kernel, mutants._rmsnorm_bwd_kernel_block_mean)):
        ours, theirs = _code_lines(kernel), _code_lines(mutant)
        assert len(ours) == len(theirs)
        differing = [(a, b) for a, b in zip(ours, theirs) if a != b]
        assert differing, "the mutant carries no defect"
        for a, b in differing:
            assert b == a.replace("/ N", "/ BLOCK_N"), (a, b)


class _FakeCompiled:
    function, packed_metadata = "function", "packed"

    def __init__(self, fail=False):
        self.runs, self.fail = [], fail

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream)

    def run(self, *args):
        if self.fail:
            raise TypeError("launcher takes other arguments")
        self.runs.append(args)


class _FakeKernel:
    def __init__(self, compiled):
        self.compiled, self.jit_calls = compiled, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self.compiled

        return launch


@pytest.fixture
def fake_gpu_launch(monkeypatch):
    """_launch as on a GPU, with Triton's driver and knobs stood in for."""
    import types

    driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 77))
    knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(launch_enter_hook="enter", launch_exit_hook="exit"))
    monkeypatch.setattr(kernels, "_ON_GPU", True)
    monkeypatch.setattr(kernels, "FAST_LAUNCH", True)
    monkeypatch.setattr(kernels, "_driver", driver)
    monkeypatch.setattr(kernels, "_knobs", knobs)


def test_fast_launch_reuses_the_compiled_kernel_with_triton_s_own_call(fake_gpu_launch):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    x = torch.zeros(64)
    args, constexprs, key = (x, 5, 1e-6), (("BLOCK_M", 4), ("BLOCK_N", 512)), ("key",)
    kernels._launch(kernel, (3,), args, constexprs, 4, key)
    assert kernel.jit_calls == [((3,), args, {"BLOCK_M": 4, "BLOCK_N": 512, "num_warps": 4})] and compiled.runs == []
    kernels._launch(kernel, (3, 2), args, constexprs, 4, key)
    assert len(kernel.jit_calls) == 1  # the second launch skips Triton's binder
    assert compiled.runs == [(3, 2, 1, 77, "function", "packed", ("metadata", (3, 2), 77), "enter", "exit", x, 5, 1e-6, 4, 512)]


def test_fast_launch_passes_no_launch_metadata_without_a_launch_hook(fake_gpu_launch, monkeypatch):
    monkeypatch.setattr(kernels._knobs.runtime, "launch_enter_hook", None)
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    for _ in range(2):
        kernels._launch(kernel, (1,), (torch.zeros(4),), (), 4, ("key",))
    assert compiled.runs[0][6:9] == (None, None, "exit")


def _fresh(shape, dtype=torch.float32, offset=0):
    """A tensor of ``shape`` whose data starts ``offset`` elements into its storage."""
    n = math.prod(shape)
    return torch.randn(n + offset).to(dtype)[offset:].view(shape)


_BASE_FWD = lambda: (_fresh((6, 40)), _fresh((40,)))  # noqa: E731


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(lambda: (_fresh((6, 40), offset=1), _fresh((40,))), id="x-no-longer-16-byte-aligned"),
        pytest.param(lambda: (_fresh((6, 40)), _fresh((40,), offset=1)), id="gamma-no-longer-16-byte-aligned"),
        pytest.param(lambda: (_fresh((6, 40), torch.float16), _fresh((40,), torch.float16)), id="other-dtype"),
        pytest.param(lambda: (_fresh((6, 40), torch.float16), _fresh((40,))), id="mixed-precision"),
        pytest.param(lambda: (_fresh((1, 40)), _fresh((40,))), id="one-row"),
        pytest.param(lambda: (_fresh((16, 40)), _fresh((40,))), id="other-row-count"),
        pytest.param(lambda: (_fresh((6, 48))[:, :40], _fresh((40,))), id="other-row-stride"),
        pytest.param(lambda: (_fresh((6, 32)), _fresh((32,))), id="other-n"),
    ],
)
def test_fast_launch_never_reuses_a_forward_kernel_across_specializations(changed, fake_gpu_launch, monkeypatch):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    monkeypatch.setattr(kernels, "_rmsnorm_fwd_kernel", kernel)
    kernels.rmsnorm_forward(*_BASE_FWD(), 1e-6)
    kernels.rmsnorm_forward(*_BASE_FWD(), 1e-6)  # new tensors, same specialization: reused
    assert len(kernel.jit_calls) == 1 and len(compiled.runs) == 1
    kernels.rmsnorm_forward(*changed(), 1e-6)
    assert len(kernel.jit_calls) == 2 and len(compiled.runs) == 1


@pytest.mark.parametrize(
    "changed_dy",
    [
        pytest.param(lambda: _fresh((6, 40), offset=1), id="dy-no-longer-16-byte-aligned"),
        pytest.param(lambda: _fresh((6, 48))[:, :40], id="dy-other-row-stride"),
        pytest.param(lambda: _fresh((6, 40), torch.float64), id="dy-other-dtype"),
    ],
)
def test_fast_launch_never_reuses_a_backward_kernel_across_specializations(changed_dy, fake_gpu_launch, monkeypatch):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    monkeypatch.setattr(kernels, "_rmsnorm_bwd_kernel", kernel)
    x, gamma = _BASE_FWD()
    kernels.rmsnorm_backward(_fresh((6, 40)), x, gamma, 1e-6)
    kernels.rmsnorm_backward(_fresh((6, 40)), x, gamma, 1e-6)
    assert len(kernel.jit_calls) == 1 and len(compiled.runs) == 1
    kernels.rmsnorm_backward(changed_dy(), x, gamma, 1e-6)
    assert len(kernel.jit_calls) == 2 and len(compiled.runs) == 1


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(lambda x: ((x, 5, 1e-6), (("BLOCK_M", 8),), 4), id="another-constexpr"),
        pytest.param(lambda x: ((x, 5, 1e-6), (("BLOCK_M", 4),), 8), id="other-warps"),
    ],
)
def test_fast_launch_never_reuses_a_kernel_across_launch_plans(changed, fake_gpu_launch):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    x = torch.zeros(64)
    kernels._launch(kernel, (1,), (x, 5, 1e-6), (("BLOCK_M", 4),), 4, ("key",))
    kernels._launch(kernel, (1,), *changed(x), ("key",))
    assert len(kernel.jit_calls) == 2 and compiled.runs == []


def test_fast_launch_never_reuses_a_kernel_across_current_devices(fake_gpu_launch, monkeypatch):
    """Triton compiles for the current device; a kernel loaded on one GPU is not launched on another."""
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    kernels._launch(kernel, (1,), (torch.zeros(4),), (), 4, ("key",))
    monkeypatch.setattr(kernels._driver.active, "get_current_device", lambda: 1)
    kernels._launch(kernel, (1,), (torch.zeros(4),), (), 4, ("key",))
    assert len(kernel.jit_calls) == 2 and compiled.runs == []


def test_fast_launch_falls_back_to_triton_for_good_when_the_interface_differs(fake_gpu_launch):
    kernel = _FakeKernel(_FakeCompiled(fail=True))
    x = torch.zeros(64)
    for _ in range(3):
        kernels._launch(kernel, (1,), (x,), (), 4, ("key",))
    assert kernels.FAST_LAUNCH is False
    assert len(kernel.jit_calls) == 3  # every launch still happened, through Triton's JIT
