"""The custom op: opcheck, torch.compile without graph breaks, call counters, autograd registration, and
x without rows (an empty y and a zero dgamma, no kernel launched)."""

import pytest
import torch

import rmsnorm_kernel
from rmsnorm_kernel import RMSNorm, call_counts, reset_call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import launchers
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.reference import DEFAULT_EPS
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import kernel_launches_forbidden, make_inputs
from rmsnorm_kernel.training.network import build_network
from tests.ops.helpers import (
    NO_ROWS,
    NO_ROWS_DTYPES,
    assert_empty_y_empty_dx_zero_dgamma,
    dtype_pair_id,
    leaves_without_rows,
)


@pytest.mark.parametrize(
    "shape,dtype,gamma_dtype",
    [((17, 257), torch.float32, None), ((2, 3, 64), torch.float16, None), ((5, 33), torch.bfloat16, torch.float32)],
    ids=str,
)
def test_opcheck_passes_all_default_tests(shape, dtype, gamma_dtype, device):
    x, gamma, _ = make_inputs(shape, dtype, device, gamma_dtype=gamma_dtype)
    torch.library.opcheck(
        torch.ops.rmsnorm_kernel.rmsnorm.default,
        (x.requires_grad_(), gamma.requires_grad_(), 1e-6),
    )


def test_opcheck_passes_with_the_silu_activation(device):
    x, gamma, dy = make_inputs((17, 257), torch.bfloat16, device, gamma_dtype=torch.float32)
    torch.library.opcheck(
        torch.ops.rmsnorm_kernel.rmsnorm.default,
        (x.requires_grad_(), gamma.requires_grad_(), 1e-6, "silu"),
    )
    torch.library.opcheck(
        torch.ops.rmsnorm_kernel.rmsnorm_backward.default,
        (dy, x.detach(), gamma.detach(), 1e-6, "silu"),
    )


def test_backward_op_passes_opcheck(device):
    x, gamma, dy = make_inputs((17, 257), torch.float32, device)
    torch.library.opcheck(torch.ops.rmsnorm_kernel.rmsnorm_backward.default, (dy, x, gamma, 1e-6))


def test_op_is_registered_under_its_public_name(device):
    x, gamma, _ = make_inputs((3, 8), torch.float32, device)
    assert torch.equal(torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, 1e-6), rmsnorm(x, gamma))


def demo_network(hidden_dim=33):
    """The demo network on the Triton path: 8 inputs, ``hidden_dim`` normalized features, 4 outputs."""
    return build_network(8, hidden_dim, 4, norm_impl="triton", eps=DEFAULT_EPS)


def test_torch_compile_fullgraph_traces_the_op_without_graph_breaks(device):
    """fullgraph=True raises at the first graph break: compiling and running is the proof."""
    torch.manual_seed(0)
    net = demo_network().to(device)
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


@pytest.mark.gpu
def test_reduce_overhead_training_step_counts_every_cuda_graph_replay(device):
    """torch.compile(mode="reduce-overhead") replays the step from a CUDA graph, with no Python around
    the kernels; the counters still see one forward and one backward per step, and the step computes
    what the eager one does."""
    torch.manual_seed(0)
    net = demo_network(257).to(device)
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


@pytest.mark.gpu
def test_compiled_code_launches_the_kernels_without_this_packages_python(device, monkeypatch):
    """On a GPU the op is a triton_op: Inductor's generated code launches the kernels itself. After the
    first (tracing) call, the launchers' Python never runs, yet every call is counted and correct."""
    torch.manual_seed(0)
    net = demo_network(257).to(device)
    x = torch.randn(64, 8, device=device)
    torch.compiler.reset()
    step = torch.compile(lambda inp: net(inp).square().mean(), fullgraph=True)
    step(x).backward()  # traces, plans and compiles
    python_calls = []
    for name in ("rmsnorm_forward", "rmsnorm_backward"):
        launcher = getattr(launchers, name)
        monkeypatch.setattr(launchers, name, lambda *a, _f=launcher, **k: python_calls.append(1) or _f(*a, **k))
    net.zero_grad(set_to_none=True)
    reset_call_counts()
    for _ in range(3):
        loss = step(x)
        loss.backward()
    assert call_counts() == {"forward": 3, "backward": 3}
    assert python_calls == []
    with torch.no_grad():
        assert compare(loss, net(x).square().mean()).ok


@pytest.mark.gpu
def test_dynamic_shapes_give_the_eager_result_at_every_row_count(device):
    """dynamic=True: the row count stays symbolic in the plan (guards, not one graph per shape); every
    shape gives the eager result and is counted."""
    torch.manual_seed(0)
    gamma = torch.rand(257, device=device) + 0.5
    torch.compiler.reset()
    fn = torch.compile(lambda x: rmsnorm(x, gamma) * 2, fullgraph=True, dynamic=True)
    reset_call_counts()
    for rows in (1000, 1500, 2048, 3001):
        x = torch.randn(rows, 257, device=device)
        assert compare(fn(x), rmsnorm(x, gamma) * 2).ok, rows
    assert call_counts()["forward"] == 8


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


# --------------------------------------------------------------------------------------------------
# x without rows (an empty expert of a mixture of experts): an empty y, an empty dx, dgamma zeros


PATHS = {"triton": rmsnorm, "reference": rmsnorm_reference}


@pytest.mark.parametrize("dtypes", NO_ROWS_DTYPES, ids=dtype_pair_id)
@pytest.mark.parametrize("shape", NO_ROWS, ids=str)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_x_without_rows_gives_an_empty_y_an_empty_dx_and_a_zero_dgamma(path, shape, dtypes, device):
    x, gamma = leaves_without_rows(shape, *dtypes, device)
    y = PATHS[path](x, gamma)
    y.sum().backward()
    assert_empty_y_empty_dx_zero_dgamma(y, x, gamma)


def test_x_without_rows_launches_no_kernel_and_is_not_counted(device):
    """Eager with and without autograd, and the two custom ops called directly: every Triton kernel is a
    tripwire, and the counters do not move (call_counts counts the calls that computed something)."""
    x, gamma = leaves_without_rows((2, 0, 33), torch.float32, torch.float32, device)
    dy = torch.randn(2, 0, 33, device=device)
    before = call_counts()
    with kernel_launches_forbidden():
        y = rmsnorm(x, gamma)
        y.backward(dy)
        with torch.no_grad():
            y_no_grad = rmsnorm(x, gamma)
        y_op = torch.ops.rmsnorm_kernel.rmsnorm(x.detach(), gamma.detach(), 1e-6)
        dx_op, dgamma_op = torch.ops.rmsnorm_kernel.rmsnorm_backward(dy, x.detach(), gamma.detach(), 1e-6)
    assert call_counts() == before
    assert_empty_y_empty_dx_zero_dgamma(y, x, gamma)
    assert y_no_grad.shape == y_op.shape == dx_op.shape == x.shape
    assert torch.equal(dgamma_op, torch.zeros_like(gamma))


@pytest.mark.parametrize("op", ["rmsnorm", "rmsnorm_backward"])
def test_opcheck_passes_on_an_x_without_rows(op, device):
    x, gamma = leaves_without_rows((2, 0, 33), torch.bfloat16, torch.float32, device)  # mixed precision
    if op == "rmsnorm":
        torch.library.opcheck(torch.ops.rmsnorm_kernel.rmsnorm.default, (x, gamma, 1e-6))
    else:
        dy = torch.randn(2, 0, 33, device=device, dtype=torch.bfloat16)
        torch.library.opcheck(
            torch.ops.rmsnorm_kernel.rmsnorm_backward.default,
            (dy, x.detach(), gamma.detach(), 1e-6),
        )


@pytest.mark.parametrize("impl", IMPLS)
def test_torch_compile_fullgraph_of_an_x_without_rows_gives_an_empty_y_and_a_zero_dgamma(impl, device, monkeypatch):
    """RMSNorm under torch.compile(fullgraph=True), bfloat16 x of shape (2, 0, N) into a float32 weight (mixed
    precision). The Triton path's compiled graph reaches the launchers through the custom ops (seen by a
    spy: at trace time on a GPU, where the op is a triton_op, on every call under the interpreter), and
    they launch nothing (tripwires) and count nothing."""
    reached = []

    def spy(name):
        real = getattr(launchers, name)

        def launcher(*args, **kwargs):
            reached.append(name)
            return real(*args, **kwargs)

        return launcher

    for name in ("rmsnorm_forward", "rmsnorm_backward"):
        monkeypatch.setattr(launchers, name, spy(name))
    torch.compiler.reset()
    norm = RMSNorm(33, impl=impl).to(device)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 33))
    x = torch.randn(2, 0, 33, device=device, dtype=torch.bfloat16, requires_grad=True)
    before = call_counts()
    # Without the on-disk caches: a graph an earlier process compiled would not be traced again.
    with kernel_launches_forbidden(), torch.compiler.config.patch(force_disable_caches=True):
        y = torch.compile(norm, fullgraph=True)(x)
        y.sum().backward()
    assert_empty_y_empty_dx_zero_dgamma(y, x, norm.weight)
    assert sorted(set(reached)) == (["rmsnorm_backward", "rmsnorm_forward"] if impl == "triton" else [])
    assert call_counts() == before


def test_opcheck_passes_for_the_residual_add_and_its_backward(device):
    x, gamma, dy = make_inputs((17, 257), torch.bfloat16, device, gamma_dtype=torch.float32)
    residual, _, dh = make_inputs((17, 257), torch.bfloat16, device, seed=1)
    for residual_in_fp32 in (False, True):
        torch.library.opcheck(
            torch.ops.rmsnorm_kernel.add_rmsnorm.default,
            (x.clone().requires_grad_(), residual.clone().requires_grad_(), gamma.clone().requires_grad_()),
            {"eps": 1e-6, "residual_in_fp32": residual_in_fp32},
        )
    torch.library.opcheck(torch.ops.rmsnorm_kernel.rmsnorm_backward.default, (dy, x, gamma, 1e-6), {"dh": dh})


@pytest.mark.parametrize("impl", IMPLS)
def test_residual_add_compiles_without_graph_breaks_and_gives_the_eager_result(impl, device):
    torch.manual_seed(0)
    norm = RMSNorm(257, eps=1e-6, impl=impl).to(device)
    x, gamma, dy = make_inputs((16, 257), torch.float32, device)
    residual = make_inputs((16, 257), torch.float32, device, seed=1)[0]
    with torch.no_grad():
        norm.weight.copy_(gamma)

    def step(fn):
        xl, rl = x.clone().requires_grad_(), residual.clone().requires_grad_()
        y, h = fn(xl, rl)
        (y * dy + h).sum().backward()
        return y.detach(), h.detach(), xl.grad, rl.grad

    eager = step(lambda a, b: norm(a, b))
    norm.zero_grad()
    torch.compiler.reset()
    compiled = step(torch.compile(lambda a, b: norm(a, b), fullgraph=True))
    for e, c in zip(eager, compiled):
        assert compare(c, e).ok
