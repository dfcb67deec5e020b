"""The tripwire: every Triton kernel of ops/kernels.py and ops/looped_kernels.py replaced by one that
raises on any use, and the real kernels back afterwards."""

import re
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel import rmsnorm, rmsnorm_reference
from rmsnorm_kernel.ops import kernels, launchers, looped_kernels
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import KernelLaunched, kernel_launches_forbidden, make_inputs

MODULES = (kernels, looped_kernels)


def jit_kernels_in_source() -> dict[str, object]:
    """The functions decorated with ``@triton.jit`` in the kernels' files, read from the files: name ->
    the module defining it."""
    found = {}
    for module in MODULES:
        source = Path(module.__file__).read_text()
        found.update({name: module for name in re.findall(r"^@triton\.jit\s*\ndef (\w+)\(", source, flags=re.M)})
    return found


def test_tripwire_replaces_every_triton_kernel_of_ops_kernels_and_restores_them():
    expected = jit_kernels_in_source()
    assert set(expected) >= {*launchers.FORWARD_KERNELS, *launchers.BACKWARD_KERNELS}  # the files were read right
    before = [dict(vars(m)) for m in MODULES]
    with kernel_launches_forbidden() as replaced:
        assert set(replaced) == set(expected)
        for name, module in expected.items():
            with pytest.raises(KernelLaunched, match=f"kernels.{name} was launched"):
                getattr(module, name)[(1,)]
            with pytest.raises(KernelLaunched, match=f"kernels.{name}.run was used"):
                getattr(module, name).run(grid=(1,))
    assert all(vars(m)[k] is v for m, b in zip(MODULES, before) for k, v in b.items())


def test_tripwire_restores_the_kernels_when_the_block_raises():
    before = dict(vars(kernels))
    with pytest.raises(RuntimeError, match="inside the block"):
        with kernel_launches_forbidden():
            raise RuntimeError("inside the block")
    assert all(vars(kernels)[k] is v for k, v in before.items())


@pytest.mark.parametrize("n", [257, 10000], ids=["whole-row", "looped"])
def test_tripwire_catches_a_forward_and_a_backward_launch(n, device):
    x, gamma, dy = make_inputs((2, n), torch.float32, device)
    with kernel_launches_forbidden():
        with pytest.raises(KernelLaunched):
            rmsnorm(x, gamma)
    xl = x.clone().requires_grad_()
    y = rmsnorm(xl, gamma)  # a real forward, outside the tripwire
    with kernel_launches_forbidden():
        with pytest.raises(KernelLaunched):
            y.backward(dy)
    assert compare(rmsnorm(x, gamma), rmsnorm_reference(x, gamma)).ok  # the real kernels are back
