"""The LightningModule's checkpoint hooks in this process: the Triton call counts a checkpoint carries."""

import torch

from rmsnorm_kernel.training.model import RMSNormRegressor
from tests.helpers import DEVICE


def module_and_batch(hidden_dim=257):
    torch.manual_seed(0)
    module = RMSNormRegressor(input_dim=16, hidden_dim=hidden_dim, output_dim=4, norm_impl="triton", eps=1e-6, lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    return module.to(DEVICE), (x.to(DEVICE), y.to(DEVICE))


def test_a_checkpoint_without_call_counts_leaves_the_earlier_counts_unknown():
    module, _ = module_and_batch()
    module.on_load_checkpoint({"global_step": 5})
    assert module.calls_unknown_before == 5 and module.calls["train/forward"] == 0
    saved = {}
    module.on_save_checkpoint(saved)
    assert saved["calls_unknown_before"] == 5  # carried on: a later resume still knows
    fresh, _ = module_and_batch()
    fresh.on_load_checkpoint({"global_step": 5, "calls": {**module.calls, "train/forward": 5}})
    assert fresh.calls_unknown_before is None and fresh.calls["train/forward"] == 5
