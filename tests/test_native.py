"""The C++ route (native.py, native.cpp): on the GPU it replays the Python route's launches bit for bit,
and everything it cannot take goes to the Python route; off the GPU it stays off."""

import subprocess
import sys

import pytest
import torch

from rmsnorm_kernel import call_counts, kernels, native, reset_call_counts, rmsnorm
from rmsnorm_kernel.op import _RMSNormFunction

from .conftest import DEVICE, make_inputs

EPS = 1e-6
gpu_only = pytest.mark.skipif(DEVICE != "cuda", reason="the C++ route runs on the GPU only (the first test checks that it stays off on the CPU)")


def _fwd_bwd(fn, x, gamma, dy):
    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    y = fn(xl, gl, EPS)
    dx, dgamma = torch.autograd.grad(y, (xl, gl), dy)
    return y, dx, dgamma


def _takes_cpp_route(y: torch.Tensor) -> bool:
    return y.grad_fn is not None and "RMSNormNative" in y.grad_fn.name()


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU (interpreter) machine")
def test_cpu_takes_the_python_route_and_never_builds_the_extension():
    x, gamma, _ = make_inputs((4, 32), torch.float32, DEVICE)
    y = rmsnorm(x.requires_grad_(), gamma, EPS)
    assert native.apply(x, gamma, EPS) is None
    assert native.extension() is None
    assert type(y.grad_fn).__name__ == "_RMSNormFunctionBackward"


# Shapes that reach each plan: one-program backward, several programs plus the column sum, the 16 KiB
# chunked forward, looped rows with a whole and a partial last chunk, mixed precision, and 3-d x.
SHAPES = [
    ((128, 257), torch.float32, None),
    ((32, 257), torch.float32, None),
    ((2, 64, 1024), torch.bfloat16, None),
    ((4096, 1024), torch.float32, None),
    ((512, 4096), torch.float16, torch.float32),
    ((256, 4096), torch.float32, None),
    ((64, 8192), torch.bfloat16, None),
    ((16, 65536), torch.bfloat16, None),
    ((8, 20000), torch.float32, None),
]


@gpu_only
@pytest.mark.parametrize("shape, dtype, gamma_dtype", SHAPES)
def test_cpp_route_gives_the_python_routes_bits(shape, dtype, gamma_dtype):
    x, gamma, dy = make_inputs(shape, dtype, DEVICE, gamma_dtype)
    y_py, dx_py, dg_py = _fwd_bwd(_RMSNormFunction.apply, x, gamma, dy)
    for _ in range(2):  # the first call records the recipe, the second replays it
        y, dx, dgamma = _fwd_bwd(rmsnorm, x, gamma, dy)
        assert _takes_cpp_route(y)
        assert torch.equal(y, y_py) and torch.equal(dx, dx_py) and torch.equal(dgamma, dg_py)
        with torch.no_grad():
            assert torch.equal(rmsnorm(x, gamma, EPS), y_py)


@gpu_only
def test_cpp_route_counts_each_forward_and_backward():
    x, gamma, dy = make_inputs((64, 512), torch.float32, DEVICE)
    _fwd_bwd(rmsnorm, x, gamma, dy)  # records the recipe
    reset_call_counts()
    y, _, _ = _fwd_bwd(rmsnorm, x, gamma, dy)
    with torch.no_grad():
        rmsnorm(x, gamma, EPS)
    assert _takes_cpp_route(y)
    assert call_counts() == {"forward": 2, "backward": 1}
    assert native.call_counts() == (2, 1)


@gpu_only
def test_cpp_route_reads_a_broadcast_gradient():
    x, gamma, _ = make_inputs((48, 300), torch.float32, DEVICE)
    grads = []
    for fn in (_RMSNormFunction.apply, rmsnorm):
        xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        y = fn(xl, gl, EPS)
        y.sum().backward()  # dy is a stride-0 expand of a scalar
        grads.append((xl.grad, gl.grad))
    assert _takes_cpp_route(y)
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@gpu_only
def test_rows_off_a_16_byte_boundary_and_strided_rows_take_the_python_route():
    wide, gamma, _ = make_inputs((64, 1028), torch.float32, DEVICE)
    gamma = gamma[:1024]
    for x in (wide[:, 1:1025], wide[:, :1024]):  # unaligned start; aligned but strided rows
        xl = x.detach().requires_grad_()
        y = rmsnorm(xl, gamma.detach().requires_grad_(), EPS)
        assert not _takes_cpp_route(y)
        assert type(y.grad_fn).__name__ == "_RMSNormFunctionBackward"


@gpu_only
def test_cpp_route_is_bypassed_when_disabled(monkeypatch):
    monkeypatch.setattr(native, "_extension", None)
    monkeypatch.setattr(native, "_built", True)
    x, gamma, dy = make_inputs((16, 128), torch.float32, DEVICE)
    y, _, _ = _fwd_bwd(rmsnorm, x, gamma, dy)
    assert not _takes_cpp_route(y)


@gpu_only
def test_recording_sees_every_launch_of_a_call():
    x, gamma, dy = make_inputs((4096, 1024), torch.float32, DEVICE)
    kernels.rmsnorm_backward(dy, x, gamma, EPS)  # compiled and cached
    with kernels.recording() as launches:
        kernels.rmsnorm_backward(dy, x, gamma, EPS)
    assert kernels.plan_for(x, gamma).partial_rows > 0  # this shape runs the column sum too
    assert len(launches) == 2


@gpu_only
def test_cpp_route_backward_runs_as_the_first_cuda_work_of_a_fresh_process():
    # Autograd's device thread may have no current CUDA context when the C++ backward first launches.
    script = (
        "import torch\n"
        "from rmsnorm_kernel import rmsnorm\n"
        "x = torch.randn(64, 256, device='cuda', requires_grad=True)\n"
        "g = torch.ones(256, device='cuda', requires_grad=True)\n"
        "for _ in range(2):\n"
        "    y = rmsnorm(x, g)\n"
        "    assert 'RMSNormNative' in y.grad_fn.name(), y.grad_fn.name()\n"
        "    y.sum().backward()\n"
        "torch.cuda.synchronize()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@gpu_only
def test_a_key_whose_backward_the_contract_refuses_is_not_recorded(monkeypatch):
    from rmsnorm_kernel import contract

    x, gamma, _ = make_inputs((100, 4096), torch.float32, DEVICE)
    monkeypatch.setattr(contract, "DGAMMA_SCRATCH_BUDGET_BYTES", 0)
    monkeypatch.setattr(native, "_unsupported", set())  # the refusal below must not outlive this test
    monkeypatch.setattr(kernels, "rmsnorm_backward", lambda *a: pytest.fail("recording ran the backward"))
    checks = []
    monkeypatch.setattr(native, "check_backward_scratch", lambda t: checks.append(t) or contract.check_backward_scratch(t))
    with torch.no_grad():
        y = rmsnorm(x, gamma, EPS)
        y_again = rmsnorm(x, gamma, EPS)
    assert torch.equal(y, kernels.rmsnorm_forward(x, gamma, EPS)) and torch.equal(y_again, y)
    assert native.extension().apply(x, gamma, EPS) is None  # no recipe was stored for this key
    assert len(checks) == 1  # the refusal is remembered: the second call does not check the scratch again


# The recipe description (native._specs) is plain Python over Triton's compiled-kernel objects; these
# stand-ins carry only the attributes it reads, so it is checked on every machine.


def _compiled(arg_names, signature, **meta):
    from types import SimpleNamespace

    defaults = dict(num_warps=4, shared=1024, num_ctas=1, global_scratch_size=0, profile_scratch_size=0)
    return SimpleNamespace(
        src=SimpleNamespace(fn=SimpleNamespace(arg_names=arg_names), signature=signature),
        metadata=SimpleNamespace(**{**defaults, **meta}),
        function=0xABC,
    )


def test_specs_number_tensor_slots_then_scratch_and_classify_each_argument():
    dy, x, gamma, dx, dgamma = (torch.empty(8, 16) for _ in range(5))
    partial = torch.empty(3, 16, dtype=torch.float64)
    names = ["DY", "X", "P", "M", "N", "stride", "eps", "BLOCK"]
    sig = {"DY": "*fp32", "X": "*fp32", "P": "*fp64", "M": "i32", "N": "constexpr", "stride": "i64", "eps": "fp32",
           "BLOCK": "constexpr"}
    launched = kernels.Launched(_compiled(names, sig), (5,), (dy, x[:4], partial, 8, 1, 2**40, EPS, 64))
    scratch = []
    specs = native._specs([launched, launched], [dy, x, gamma, dx, dgamma], scratch, EPS)
    assert scratch == [partial]  # found once, numbered after the five slots
    args = [(native._TENSOR, 0), (native._TENSOR, 1), (native._TENSOR, 5), (native._I32, 8), (native._I64, 2**40),
            (native._EPS, 0)]
    assert specs == [(0xABC, 5, 1, 128, 1024, args)] * 2


@pytest.mark.parametrize("change", ["global scratch", "clusters", "other float", "unknown tensor", "no launch"])
def test_specs_refuse_what_the_cpp_route_cannot_replay(change):
    x, gamma, y = torch.empty(4, 8), torch.empty(8), torch.empty(4, 8)
    meta = {"global scratch": {"global_scratch_size": 128}, "clusters": {"num_ctas": 2}}.get(change, {})
    eps = 0.5 if change == "other float" else EPS
    y_arg = torch.empty(4, 8) if change == "unknown tensor" else y
    compiled = _compiled(["X", "G", "Y", "eps"], {"X": "*fp32", "G": "*fp32", "Y": "*fp32", "eps": "fp32"}, **meta)
    launches = [] if change == "no launch" else [kernels.Launched(compiled, (1,), (x, gamma, y_arg, eps))]
    assert native._specs(launches, [x, gamma, y], None, EPS) is None
    ok = kernels.Launched(_compiled(["X", "G", "Y", "eps"], {"X": "*fp32", "G": "*fp32", "Y": "*fp32", "eps": "fp32"}),
                          (1,), (x, gamma, y, EPS))
    assert native._specs([ok], [x, gamma, y], None, EPS) is not None  # the unchanged launch is accepted
