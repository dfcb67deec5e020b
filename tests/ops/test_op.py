"""The custom op: opcheck, torch.compile without graph breaks, call counters, autograd registration."""

import pytest
import torch
from torch import nn

import rmsnorm_kernel
from rmsnorm_kernel import RMSNorm, call_counts, reset_call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.tolerances import compare

from .conftest import make_inputs


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
    torch.manual_seed(0)
    net = SmallNet().to(device)
    x = torch.randn(16, 8, device=device)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1

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
