"""The call counters: off by default, on inside ``counting()``, counted by the declared op
``rmsnorm_kernel::count_call`` in eager code and in compiled graphs alike."""

import pytest
import torch

from rmsnorm_kernel import RMSNorm, call_counts, counting, reset_call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import counters
from rmsnorm_kernel.testing import make_inputs


def test_counters_count_each_forward_and_backward_call_inside_counting(device):
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    with counting():
        reset_call_counts()
        assert call_counts() == {"forward": 0, "backward": 0}
        with torch.no_grad():
            rmsnorm(x, gamma)
        y = rmsnorm(x.requires_grad_(), gamma)
        y.backward(dy)
        assert call_counts() == {"forward": 2, "backward": 1}
        rmsnorm_reference(x, gamma).backward(dy)  # the reference path is not counted
        assert call_counts() == {"forward": 2, "backward": 1}
        x_long, gamma_long, dy_long = make_inputs((2, 9000), torch.float32, device)  # the looped kernels
        rmsnorm(x_long.requires_grad_(), gamma_long).backward(dy_long)
        assert call_counts() == {"forward": 3, "backward": 2}
        reset_call_counts()
        assert call_counts() == {"forward": 0, "backward": 0}


def test_nothing_is_counted_outside_counting(device, monkeypatch):
    monkeypatch.setattr(counters, "_enabled", False)  # as outside every counting() block (conftest enters one)
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    reset_call_counts()
    rmsnorm(x.requires_grad_(), gamma).backward(dy)
    rmsnorm(x, gamma, residual=torch.randn_like(x))[0].sum().backward()
    assert call_counts() == {"forward": 0, "backward": 0}
    with counting():
        rmsnorm(x, gamma)
    rmsnorm(x, gamma)
    assert call_counts() == {"forward": 1, "backward": 0}


def test_the_norm_with_a_residual_counts_its_backward_only_when_its_kernels_run(device):
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    residual = torch.randn_like(x, requires_grad=True)
    with counting():
        reset_call_counts()
        y, h = rmsnorm(x.requires_grad_(), gamma, residual=residual)
        (y * dy).sum().backward()
        assert call_counts() == {"forward": 1, "backward": 1}
        _, h = rmsnorm(x, gamma, residual=residual)
        h.sum().backward()  # only h went on: an add's gradient, no backward kernel
        assert call_counts() == {"forward": 2, "backward": 1}


def test_count_call_declares_its_write_and_refuses_an_unknown_direction():
    schema = torch.ops.rmsnorm_kernel.count_call.default._schema
    assert schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write
    with pytest.raises(ValueError, match="accepted: 0 or 1"):
        counters.count_call(torch.zeros(2, dtype=torch.int64), 2)


def test_a_compiled_step_counts_once_per_run_forward_and_backward(device, monkeypatch):
    """The counts are made while torch.compile traces the first call (``assume_constant_result``), as real
    tensors, and the compiled graphs, forward and backward, count every call."""
    monkeypatch.setattr(counters, "_COUNTS", {})
    x, gamma, dy = make_inputs((4, 16), torch.float32, device)
    norm = RMSNorm(16, device=device)
    torch.compiler.reset()
    fn = torch.compile(lambda a: norm(a) * 2, fullgraph=True)
    with counting():
        for _ in range(3):
            fn(x.requires_grad_()).backward(dy)
        assert list(counters._COUNTS) == [str(x.device)]
        assert call_counts() == {"forward": 3, "backward": 3}


def test_count_call_passes_opcheck(device):
    torch.library.opcheck(counters.count_call, (torch.zeros(2, dtype=torch.int64, device=device), 1))
