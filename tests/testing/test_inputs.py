"""The one input generator: reproducible by seed, the same values in every dtype, gamma never all ones."""

import torch

from rmsnorm_kernel.testing import make_inputs


def test_same_seed_gives_the_same_values_and_another_seed_others():
    a = make_inputs((3, 7), torch.float32, "cpu", seed=5)
    b = make_inputs((3, 7), torch.float32, "cpu", seed=5)
    c = make_inputs((3, 7), torch.float32, "cpu", seed=6)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not any(torch.equal(u, v) for u, v in zip(a, c))


def test_shapes_and_dtypes_with_a_gamma_dtype_of_its_own():
    x, gamma, dy = make_inputs((2, 3, 5), torch.bfloat16, "cpu", gamma_dtype=torch.float32)
    assert (x.shape, dy.shape, gamma.shape) == ((2, 3, 5), (2, 3, 5), (5,))
    assert (x.dtype, dy.dtype, gamma.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)


def test_every_dtype_holds_the_float32_values_cast():
    x32, g32, dy32 = make_inputs((4, 9), torch.float32, "cpu", seed=3)
    for dtype in (torch.float16, torch.bfloat16):
        x, g, dy = make_inputs((4, 9), dtype, "cpu", seed=3)
        assert torch.equal(x, x32.to(dtype)) and torch.equal(g, g32.to(dtype)) and torch.equal(dy, dy32.to(dtype))


def test_gamma_is_not_all_ones_and_x_not_zeros():
    x, gamma, dy = make_inputs((8, 64), torch.float32, "cpu")
    assert not torch.equal(gamma, torch.ones_like(gamma))
    assert x.abs().sum() > 0 and dy.abs().sum() > 0
