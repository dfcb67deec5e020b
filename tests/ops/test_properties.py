"""Property-based: random shapes, dtypes and magnitudes, the Triton path against the oracle."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmsnorm_kernel import rmsnorm, rmsnorm_reference
from rmsnorm_kernel.backend import kernel_device_type
from rmsnorm_kernel.tolerances import compare

DEVICE = kernel_device_type()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    leading=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    n=st.integers(1, 1100),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    log_scale=st.floats(-3, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_triton_path_matches_the_oracle_forward_and_backward(leading, n, dtype, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (*leading, n)
    scale = 10.0**log_scale
    x = (scale * torch.randn(shape, generator=g)).to(device=DEVICE, dtype=dtype)
    gamma = (1 + 0.5 * torch.randn(n, generator=g)).to(device=DEVICE, dtype=dtype)
    dy = torch.randn(shape, generator=g).to(device=DEVICE, dtype=dtype)
    results = []
    for fn in (rmsnorm, rmsnorm_reference):
        xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        y = fn(xl, gl)
        y.backward(dy)
        results.append((y.detach(), xl.grad, gl.grad))
    for name, got, want in zip(("y", "dx", "dgamma"), *results):
        c = compare(got, want)
        assert c.ok, f"{name} {dtype} {shape} scale {scale:.3g}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}"
