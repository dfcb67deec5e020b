"""torch.export and AOTInductor of models that use the Triton path (module, functional and residual
forms), and what the public op does with arguments of the wrong kind."""

import io
import subprocess
import sys
import textwrap

import pytest
import torch

from rmsnorm_kernel import RMSNorm, call_counts, reset_call_counts
from rmsnorm_kernel.ops import counters

# One network with the three forms: the module, the function with the fused SiLU, the residual add.
NET = textwrap.dedent(
    """
    import torch
    from rmsnorm_kernel import RMSNorm, rmsnorm

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 24)
            self.norm = RMSNorm(24)
            self.gamma = torch.nn.Parameter(torch.linspace(0.5, 1.5, 24))

        def forward(self, x, residual):
            h = self.lin(x)
            a = self.norm(h)
            b = rmsnorm(h, self.gamma, 1e-6, activation="silu")
            y, h2 = rmsnorm(a, self.gamma, 1e-6, residual=residual)
            return a + b + y + h2
    """
)


def _net_and_inputs(device):
    scope: dict = {}
    exec(NET, scope)
    torch.manual_seed(0)
    net = scope["Net"]().to(device)
    return net, (torch.randn(5, 8, device=device), torch.randn(5, 24, device=device))


def test_an_exported_program_holds_the_ops_and_runs_bit_identical_after_a_save_and_load(device, monkeypatch):
    monkeypatch.setattr(counters, "_enabled", False)  # exported outside counting(), as operator.md says
    net, inputs = _net_and_inputs(device)
    want = net(*inputs).detach()
    program = torch.export.export(net, inputs)
    called = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"rmsnorm_kernel.rmsnorm.default", "rmsnorm_kernel.add_rmsnorm.default"} <= called
    assert not any("count_call" in name for name in called)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    reset_call_counts()
    assert torch.equal(loaded.module()(*inputs), want)
    assert call_counts() == {"forward": 0, "backward": 0}  # the program's ops are not rmsnorm()'s calls


@pytest.mark.slow
def test_a_program_exported_in_a_fresh_process_runs_correct_in_another(tmp_path, device):
    """Export in one process, load and run in a second: nothing of the first process (an address, a
    counter) travels in the program."""
    program, want = tmp_path / "net.pt2", tmp_path / "want.pt"
    export = NET + textwrap.dedent(
        f"""
        torch.manual_seed(0)
        net = Net().to({device!r})
        inputs = (torch.randn(5, 8, device={device!r}), torch.randn(5, 24, device={device!r}))
        torch.export.save(torch.export.export(net, inputs), {str(program)!r})
        torch.save((inputs, net(*inputs).detach()), {str(want)!r})
        """
    )
    load = textwrap.dedent(
        f"""
        import torch
        import rmsnorm_kernel.ops.op  # registers the ops
        inputs, want = torch.load({str(want)!r})
        got = torch.export.load({str(program)!r}).module()(*inputs)
        assert torch.equal(got, want), (got - want).abs().max()
        print("ok")
        """
    )
    for script in (export, load):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.gpu
@pytest.mark.slow
def test_aot_inductor_packages_a_program_that_runs_correct(tmp_path):
    """In a process of its own: a crash while loading the package fails this test, not the session."""
    script = NET + textwrap.dedent(
        f"""
        torch.manual_seed(0)
        net = Net().cuda()
        inputs = (torch.randn(5, 8, device="cuda"), torch.randn(5, 24, device="cuda"))
        want = net(*inputs).detach()
        program = torch.export.export(net, inputs)
        path = torch._inductor.aoti_compile_and_package(program, package_path={str(tmp_path / "n.pt2")!r})
        got = torch._inductor.aoti_load_package(path)(*inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # Inductor may reorder the Linear's sums
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_public_op_refuses_arguments_of_the_wrong_kind_without_crashing(device):
    x, gamma = torch.randn(4, 16, device=device), torch.ones(16, device=device)
    with pytest.raises((TypeError, RuntimeError)):
        torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, 1e-6, torch.tensor([8, 16]))
    with pytest.raises((TypeError, RuntimeError)):
        torch.ops.rmsnorm_kernel.rmsnorm_backward(x, x, gamma, 1e-6, torch.tensor([8, 16]))


def test_the_module_traces_with_torch_jit_trace_and_gives_the_same_output(device):
    norm = RMSNorm(16, device=device)
    x = torch.randn(4, 16, device=device)
    traced = torch.jit.trace(norm, (x,), check_trace=False)
    assert torch.equal(traced(x), norm(x))
    assert torch.equal(traced(x * 2), norm(x * 2))  # the op is in the trace, not a constant y
