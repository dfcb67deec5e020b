"""InitialParity: both RMSNorm paths from the module's initial weights, on the first training batch."""

from types import SimpleNamespace

import pytest
import torch

from rmsnorm_kernel.ops import kernels
from rmsnorm_kernel.ops.tolerances import TOLERANCES
from rmsnorm_kernel.training.callbacks import InitialParity
from rmsnorm_kernel.training.model import RMSNormRegressor
from tests.helpers import DEVICE

from .helpers import block_mean_forward


class Logger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))


def module_and_batch(hidden_dim=257):
    torch.manual_seed(0)
    module = RMSNormRegressor(input_dim=16, hidden_dim=hidden_dim, output_dim=4, norm_impl="triton", eps=1e-6, lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    return module.to(DEVICE), (x.to(DEVICE), y.to(DEVICE))


def measure(step=0, parity=None):
    parity = parity or InitialParity()
    module, batch = module_and_batch()
    trainer = SimpleNamespace(global_step=step, logger=Logger())
    parity.on_train_batch_start(trainer, module, batch, 0)
    return parity, trainer.logger.logged, module, batch


def test_the_paths_agree_at_step_0_and_the_errors_are_logged_there():
    parity, logged, module, (x, _) = measure()
    assert parity.ok and parity.dtype == torch.float32
    tol = TOLERANCES[torch.float32]
    with torch.no_grad():
        scale = float(module.net(x).abs().max())
    assert 0.0 <= parity.output_err <= tol.atol + tol.rtol * scale
    assert 0.0 <= parity.grad_err < 1.0  # each gradient also passed compare(); this only bounds the report
    assert logged == [(0, {"parity/initial_output_err": parity.output_err, "parity/initial_grad_err": parity.grad_err})]


def test_a_wrong_kernel_fails_initial_parity(monkeypatch):
    monkeypatch.setattr(kernels, "rmsnorm_forward", block_mean_forward)
    parity, _, _, _ = measure()
    assert not parity.ok
    assert parity.output_err > 0.1  # the means are about half what they should be


def test_a_resumed_run_measures_nothing():
    parity, logged, _, _ = measure(step=5)
    assert (parity.output_err, parity.grad_err, parity.ok, logged) == (None, None, True, [])


def test_it_measures_once(monkeypatch):
    parity, _, _, _ = measure()
    first = parity.output_err
    monkeypatch.setattr(kernels, "rmsnorm_forward", block_mean_forward)
    _, logged, _, _ = measure(parity=parity)  # step 0 again, as after a restart of the epoch loop
    assert parity.ok and parity.output_err == first and logged == []


@pytest.mark.parametrize("norm_impl", ["reference", "triton"])
def test_the_module_keeps_its_own_path_and_weights(norm_impl):
    module, batch = module_and_batch()
    module.net.norm.impl = norm_impl
    before = {k: v.clone() for k, v in module.state_dict().items()}
    InitialParity().on_train_batch_start(SimpleNamespace(global_step=0, logger=None), module, batch, 0)
    assert module.net.norm.impl == norm_impl
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())
