"""The demo network: its layers and what its constructor passes on, and that it needs no Lightning."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from rmsnorm_kernel.ops.module import RMSNorm
from rmsnorm_kernel.training.network import NETWORK_KEYS, build_network


def test_network_is_linear_rmsnorm_silu_linear_under_the_names_checkpoints_use():
    net = build_network(6, 33, 2, norm_impl="reference", eps=1e-5, norm_fallback=None)
    assert list(dict(net.named_children())) == ["inp", "norm", "out"]
    assert [type(m) for m in net] == [nn.Linear, RMSNorm, nn.Linear]
    assert net.norm.activation == "silu"
    assert (net.inp.in_features, net.inp.out_features) == (6, 33)
    assert (net.out.in_features, net.out.out_features) == (33, 2)
    assert (net.norm.normalized_shape, net.norm.eps, net.norm.impl, net.norm.fallback) == (
        (33,),
        1e-5,
        "reference",
        None,
    )
    assert sorted(net.state_dict()) == sorted(["inp.weight", "inp.bias", "norm.weight", "out.weight", "out.bias"])


@pytest.mark.parametrize("impl,fallback", [("triton", None), ("triton", "reference"), ("reference", None)])
def test_network_passes_the_norm_path_and_its_fallback_on(impl, fallback):
    net = build_network(4, 8, 3, norm_impl=impl, eps=1e-6, norm_fallback=fallback)
    assert (net.norm.impl, net.norm.fallback) == (impl, fallback)


def test_network_keys_are_the_constructor_arguments():
    net = build_network(**dict(zip(NETWORK_KEYS, (4, 8, 3, "reference", 1e-6, None))))
    assert (net.inp.in_features, net.inp.out_features, net.out.out_features) == (4, 8, 3)


def test_network_computes_linear_rmsnorm_silu_linear():
    torch.manual_seed(0)
    net = build_network(5, 7, 3, norm_impl="reference", eps=1e-6)
    x = torch.randn(4, 5, dtype=torch.float64)
    net = net.double()
    h = x @ net.inp.weight.T + net.inp.bias
    h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * net.norm.weight
    h = h * torch.sigmoid(h)
    want = h @ net.out.weight.T + net.out.bias
    torch.testing.assert_close(net(x), want, rtol=1e-12, atol=1e-12)


def test_network_and_the_check_commands_that_build_it_import_without_lightning():
    """With Lightning unimportable, the network, the compile report and the checkpoint audit still load."""
    code = (
        "import sys\n"
        "sys.modules['lightning'] = None\n"
        "from rmsnorm_kernel.training.network import build_network\n"
        "from rmsnorm_kernel.checks import checkpoint_audit, compile_report\n"
        "compile_report.demo_network()\n"
        "build_fn, problem = checkpoint_audit._import_build_network()\n"
        "assert build_fn is build_network and not problem, problem\n"
        "try:\n"
        "    import rmsnorm_kernel.training.model\n"
        "except ImportError:\n"
        "    print('model needs lightning')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "model needs lightning"  # the guard above really hides Lightning
