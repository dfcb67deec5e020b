"""The call counters: the kernels count their own calls on the device, through the addresses of
``counters.calls(device)``; ``call_counts`` and ``reset_call_counts`` read and zero them."""

import torch

from rmsnorm_kernel import call_counts, reset_call_counts, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import counters, kernels
from rmsnorm_kernel.testing import make_inputs


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
    counts = torch.zeros(2, dtype=torch.int64, device=device)  # forward, backward
    calls = counters.addresses(counts)
    kernels.rmsnorm_forward(x, gamma, 1e-6, calls)
    kernels.rmsnorm_forward(x, gamma, 1e-6, calls)
    kernels.rmsnorm_backward(dy, x, gamma, 1e-6, calls)
    assert counts.tolist() == [2, 1]
    x_long, gamma_long, dy_long = make_inputs((2, 9000), torch.float32, device)  # the looped kernels
    kernels.rmsnorm_forward(x_long, gamma_long, 1e-6, calls)
    kernels.rmsnorm_backward(dy_long, x_long, gamma_long, 1e-6, calls)
    assert counts.tolist() == [3, 2]


def test_each_device_has_one_calls_tensor_of_two_addresses_eight_bytes_apart(device):
    x = torch.zeros(1, device=device)
    calls = counters.calls(x.device)
    assert counters.calls(x.device) is calls  # made once, then the same tensor
    assert calls.dtype == torch.int64 and calls.shape == (2,) and calls.device == x.device
    forward, backward = calls.tolist()
    assert backward - forward == 8


def test_counters_made_while_torch_compile_traces_the_first_call_are_real_and_count(device, monkeypatch):
    """A process whose first call is compiled: the counters are made during tracing
    (``assume_constant_result``), as real tensors, and count that call and the next."""
    monkeypatch.setattr(counters, "_COUNTERS", {})
    x, gamma, _ = make_inputs((4, 16), torch.float32, device)
    torch.compiler.reset()
    fn = torch.compile(lambda a, g: rmsnorm(a, g) * 2, fullgraph=True)
    fn(x, gamma)
    fn(x, gamma)
    assert list(counters._COUNTERS) == [str(x.device)]
    assert call_counts() == {"forward": 2, "backward": 0}
