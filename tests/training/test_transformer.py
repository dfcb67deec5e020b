"""The Llama-style decoder: its norm calls per step, the same outputs and gradients on every path, and a
loss that falls on the standard library's text."""

import math

import pytest
import torch
import torch.nn.functional as F

from rmsnorm_kernel import RMSNorm, call_counts
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.training.text import VOCAB_SIZE, split_bytes, windows
from rmsnorm_kernel.training.transformer import Transformer, rmsnorm_calls

#: A model small enough for Triton's interpreter: 2 blocks of 2 heads of 8.
TINY = dict(vocab_size=VOCAB_SIZE, dim=16, layers=2, heads=2, mlp_hidden=32, max_seq_len=8)
#: Validation loss (nats) the tiny model must fall under in 25 steps: uniform bytes give ln 256 = 5.55.
LEARNED_LOSS = 3.5


def tiny(norm_impl: str, device, qk_norm: bool = False) -> Transformer:
    torch.manual_seed(0)
    return Transformer(**TINY, norm_impl=norm_impl, qk_norm=qk_norm).to(device)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_every_norm_takes_the_path_and_the_triton_path_runs_once_per_norm_each_way(qk_norm, device):
    model = tiny("triton", device, qk_norm)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == rmsnorm_calls(TINY["layers"], qk_norm) and {m.impl for m in norms} == {"triton"}
    tokens = torch.randint(0, VOCAB_SIZE, (2, 8), generator=torch.Generator().manual_seed(0)).to(device)
    before = call_counts()
    model(tokens).sum().backward()
    after = call_counts()
    calls = rmsnorm_calls(TINY["layers"], qk_norm)
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (calls, calls)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_every_path_gives_the_same_logits_and_gradients_in_float32(qk_norm, device):
    tokens, targets = windows(split_bytes("val"), 8, 4, seed=0)
    results = {}
    for impl in IMPLS:
        model = tiny(impl, device, qk_norm)
        logits = model(tokens.to(device))
        F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten()).backward()
        results[impl] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
    for impl in ("triton", "native"):
        assert compare(results[impl][0], results["reference"][0]).ok, impl
        for name, grad in results["reference"][1].items():
            c = compare(results[impl][1][name], grad)
            assert c.ok, f"{impl} {name}: {c.worst_over_tol:.3g} x the tolerance"


# The learning does not depend on the path (the test above: the same logits and gradients on every
# path); the Triton path's 25 steps through the interpreter run in the slow tier.
@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=pytest.mark.slow)])
def test_the_loss_falls_on_the_standard_library_text(impl, device):
    train, val = split_bytes("train"), split_bytes("val")
    vx, vy = (t.to(device) for t in windows(val, 8, 32, seed=1))
    model = tiny(impl, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def val_loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(model(vx).flatten(0, 1), vy.flatten()).item()

    assert val_loss() > math.log(VOCAB_SIZE) - 0.5  # near uniform at the start
    for step in range(25):
        x, y = (t.to(device) for t in windows(train, 8, 8, seed=100 + step))
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert val_loss() < LEARNED_LOSS


def test_a_head_size_that_rotary_embedding_cannot_pair_is_refused():
    with pytest.raises(ValueError, match="dim = 12 over heads = 4; accepted: an even head size"):
        Transformer(VOCAB_SIZE, 12, 1, 4, 16, 8, "reference")
