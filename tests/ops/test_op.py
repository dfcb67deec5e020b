"""The custom op: opcheck, torch.compile without graph breaks, call counters, autograd registration."""

import pytest
import torch
from torch import nn

import rmsnorm_kernel
from rmsnorm_kernel import RMSNorm, call_counts, reset_call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import kernels
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.verify.inputs import make_inputs


@pytest.mark.parametrize(
    "shape,dtype,gamma_dtype",
    [((17, 257), torch.float32, None), ((2, 3, 64), torch.float16, None), ((5, 33), torch.bfloat16, torch.float32)],
    ids=str,
)
def test_opcheck_passes_all_default_tests(shape, dtype, gamma_dtype, device):
    x, gamma, _ = make_inputs(shape, dtype, device, gamma_dtype=gamma_dtype)
    torch.library.opcheck(torch.ops.rmsnorm_kernel.rmsnorm.default, (x.requires_grad_(), gamma.requires_grad_(), 1e-6))


def test_backward_op_passes_opcheck(device):
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    torch.library.opcheck(torch.ops.rmsnorm_kernel.rmsnorm_backward.default, (dy, x, gamma, 1e-6))


def test_op_is_registered_under_its_public_name(device):
    x, gamma, _ = make_inputs((3, 8), torch.float32, device)
    assert torch.equal(torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, 1e-6), rmsnorm(x, gamma))


class SmallNet(nn.Module):
    def __init__(self, n=33):
        super().__init__()
        self.inp = nn.Linear(8, n)
        self.norm = RMSNorm(n, impl="triton")
        self.out = nn.Linear(n, 4)

    def forward(self, x):
        return self.out(torch.nn.functional.silu(self.norm(self.inp(x))))


def test_torch_compile_fullgraph_traces_the_op_without_graph_breaks(device):
    """fullgraph=True raises at the first graph break: compiling and running is the proof."""
    torch.manual_seed(0)
    net = SmallNet().to(device)
    x = torch.randn(16, 8, device=device)
    torch.compiler.reset()

    eager_out = net(x)
    eager_out.sum().backward()
    eager_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()

    reset_call_counts()
    compiled = torch.compile(net, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    assert call_counts() == {"forward": 1, "backward": 1}  # the compiled graph calls the Triton op
    assert compare(out, eager_out).ok
    for p, g in zip(net.parameters(), eager_grads):
        assert compare(p.grad, g).ok


def test_counters_count_each_forward_and_backward_call(device):
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    reset_call_counts()
    assert call_counts() == {"forward": 0, "backward": 0}
    with torch.no_grad():
        rmsnorm(x, gamma)
    y = rmsnorm(x.requires_grad_(), gamma)
    y.backward(dy)
    assert call_counts() == {"forward": 2, "backward": 1}
    rmsnorm_reference(x, gamma).backward(dy)  # the reference path is not counted
    assert call_counts() == {"forward": 2, "backward": 1}
    reset_call_counts()
    assert call_counts() == {"forward": 0, "backward": 0}


def test_the_kernels_themselves_increment_the_counter(device):
    """Counting happens on the device, inside the kernels, so a replayed CUDA graph counts too."""
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    forward_calls = torch.zeros(1, dtype=torch.int32, device=device)
    backward_calls = torch.zeros(1, dtype=torch.int32, device=device)
    kernels.rmsnorm_forward(x, gamma, 1e-6, forward_calls)
    kernels.rmsnorm_forward(x, gamma, 1e-6, forward_calls)
    kernels.rmsnorm_backward(dy, x, gamma, 1e-6, backward_calls)
    assert (int(forward_calls.item()), int(backward_calls.item())) == (2, 1)
    x_long, gamma_long, dy_long = make_inputs((2, 9000), torch.float32, device)  # the looped kernels
    kernels.rmsnorm_forward(x_long, gamma_long, 1e-6, forward_calls)
    kernels.rmsnorm_backward(dy_long, x_long, gamma_long, 1e-6, backward_calls)
    assert (int(forward_calls.item()), int(backward_calls.item())) == (3, 2)


@pytest.mark.gpu
def test_reduce_overhead_training_step_counts_every_cuda_graph_replay(device):
    """torch.compile(mode="reduce-overhead") replays the step from a CUDA graph, with no Python around
    the kernels; the counters still see one forward and one backward per step, and the step computes
    what the eager one does."""
    torch.manual_seed(0)
    net = SmallNet(257).to(device)
    x = torch.randn(32, 8, device=device)
    torch.compiler.reset()
    step = torch.compile(lambda inp: net(inp).square().mean(), mode="reduce-overhead", fullgraph=True)

    def grads(loss_fn):
        net.zero_grad(set_to_none=True)
        loss_fn(x).backward()
        return [p.grad.clone() for p in net.parameters()]

    eager = grads(lambda inp: net(inp).square().mean())
    reset_call_counts()
    steps = 20
    for _ in range(steps):
        compiled = grads(step)
    assert call_counts() == {"forward": steps, "backward": steps}
    for g, e in zip(compiled, eager):
        assert compare(g, e).ok


def test_gradient_flows_to_x_only_or_gamma_only(device):
    x, gamma, dy = make_inputs((6, 40), torch.float32, device)
    xl = x.clone().requires_grad_()
    rmsnorm(xl, gamma).backward(dy)
    gl = gamma.clone().requires_grad_()
    rmsnorm(x, gl).backward(dy)
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    rmsnorm_reference(xr, gr).backward(dy)
    assert compare(xl.grad, xr.grad).ok
    assert compare(gl.grad, gr.grad).ok


def test_backend_is_reported(device):
    assert rmsnorm_kernel.backend() == ("cuda" if device == "cuda" else "interpreter")
