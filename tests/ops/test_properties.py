"""Property-based: random shapes, dtypes and magnitudes, the Triton path against the oracle."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmsnorm_kernel import oracle, rmsnorm
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.verify.inputs import make_inputs
from tests.helpers import DEVICE


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    leading=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    n=st.integers(1, 1100),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    log_scale=st.floats(-3, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_triton_path_matches_the_oracle_forward_and_backward(leading, n, dtype, log_scale, seed):
    shape = (*leading, n)
    scale = 10.0**log_scale
    x, gamma, dy = make_inputs(shape, dtype, DEVICE, seed=seed)
    x = (scale * x.float()).to(dtype)
    xl, gl = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    y = rmsnorm(xl, gl)
    y.backward(dy)
    for name, got, want in zip(("y", "dx", "dgamma"), (y.detach(), xl.grad, gl.grad), oracle(x, gamma, dy)):
        c = compare(got, want)
        assert c.ok, f"{name} {dtype} {shape} scale {scale:.3g}: max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}"
