"""The environment report names this machine's backend and proves that the Triton path runs here."""

import torch

from rmsnorm_kernel.checks import campaigns, environment
from rmsnorm_kernel.testing import forward_block_mean


def test_environment_facts_name_the_versions_the_gpu_and_the_backend(device):
    facts = {f.item: f.value for f in environment.environment_facts()}
    assert facts["torch"] == torch.__version__
    assert facts["rmsnorm_kernel backend"] == ("cuda" if device == "cuda" else "interpreter")
    assert facts["kernel tensors live on"] == device
    assert ("GPU 0" in facts) == torch.cuda.is_available()
    assert (facts.get("GPU") == "none") == (not torch.cuda.is_available())


def test_environment_proof_runs_forward_dx_and_dgamma_at_one_shape(device):
    proof = environment.environment_proof(device=device)
    assert [c.campaign for c in proof] == ["forward", "dx", "dgamma", "residual"]
    assert {(c.shape, c.dtype) for c in proof} == {((17, 257), "float32")}
    assert all(c.ok for c in proof)


def test_environment_proof_fails_when_the_forward_is_wrong(device, monkeypatch):
    monkeypatch.setitem(campaigns.KERNELS["forward"], "triton", forward_block_mean)
    proof = {c.campaign: c for c in environment.environment_proof(device=device)}
    assert not proof["forward"].ok and proof["dx"].ok
