"""Property-based: random shapes, dtypes and magnitudes, the Triton path against the oracle.

The examples are derandomized (the same 40 on every run) so that CI's verdict does not depend on the
draw. At magnitudes near 1e-3 with eps = 1e-6, r is about 700 and dx's two terms are hundreds of times
larger than dx at the elements where they cancel; there one or two float32 roundings of the terms can
exceed float32's absolute tolerance (1e-5). Hypothesis found one such draw (shape (4, 247), scale
1.04e-3, seed 384856178: 1.29 times the tolerance, from a difference of one float32 unit at the
terms' scale), while 200 seeds at scale 1e-3 stay at most 0.61 times the tolerance. The seed-by-seed
test below is what caught the GPU kernels' approximate square root and reciprocal in r (up to 1.74
times the tolerance over its 20 seeds on an H200, 0.53 for the reference): the kernels now round both
correctly.
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmsnorm_kernel import oracle, rmsnorm
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs
from tests.helpers import DEVICE


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
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


def test_at_small_magnitudes_the_float32_backward_stays_within_the_tolerance_seed_after_seed():
    # the regime of the outlier in the module docstring: 20 fixed seeds at scale 1e-3, eps 1e-6
    for seed in range(20):
        x, gamma, dy = make_inputs((4, 247), torch.float32, DEVICE, seed=seed)
        x = (1e-3 * x).requires_grad_()
        gl = gamma.clone().requires_grad_()
        rmsnorm(x, gl).backward(dy)
        _, want_dx, want_dgamma = oracle(x.detach(), gamma, dy)
        assert compare(x.grad, want_dx).ok and compare(gl.grad, want_dgamma).ok, seed
