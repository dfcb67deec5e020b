"""The networks the training demo trains, by ``model.kind``: the one definition that the training, the
check commands and the tests build. Imports no Lightning, so that the check commands can rebuild them
without it.

- ``mlp``: Linear -> RMSNorm -> SiLU -> Linear, a regression. The SiLU is the norm module's
  ``activation``: every path computes silu(rmsnorm(h)) in the ``norm`` layer, the Triton path in the same
  kernels (the norm's output never goes to memory), the native path as ``F.silu(F.rms_norm(h))``, which
  ``torch.compile`` fuses into one kernel of its own. A network that had a separate SiLU layer has the
  same parameters and state dict: the SiLU has none.
- ``transformer``: the Llama-style decoder of ``transformer.py``, a byte-level language model.

Every RMSNorm of either network takes the path ``norm_impl`` names.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.module import RMSNorm
from .text import VOCAB_SIZE
from .transformer import Transformer, rmsnorm_calls

#: The constructor arguments of ``build_network``, as saved in a checkpoint's hyper-parameters.
NETWORK_KEYS = (
    "input_dim",
    "hidden_dim",
    "output_dim",
    "norm_impl",
    "eps",
    "norm_fallback",
    "dtype",
    "kind",
    "dim",
    "layers",
    "heads",
    "mlp_hidden",
    "seq_len",
    "qk_norm",
)
#: Of those, the ones a checkpoint may lack, with the value it was then trained with.
NETWORK_DEFAULTS = {
    "dtype": "float32",
    "kind": "mlp",
    "dim": None,
    "layers": None,
    "heads": None,
    "mlp_hidden": None,
    "seq_len": None,
    "qk_norm": None,
}


def build_network(
    input_dim: int | None,
    hidden_dim: int | None,
    output_dim: int | None,
    norm_impl: str,
    eps: float,
    norm_fallback: str | None = None,
    dtype: str = "float32",
    kind: str = "mlp",
    dim: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    mlp_hidden: int | None = None,
    seq_len: int | None = None,
    qk_norm: bool | None = None,
) -> nn.Module:
    """The network of ``kind``, its parameters in ``dtype`` (``"float32"``, or ``"bfloat16"`` under
    ``trainer.precision=bf16-true``): initialised in float32 and then rounded, so that both dtypes start
    from the same draws.

    ``mlp``: Linear(input_dim, N) -> RMSNorm(N) -> SiLU -> Linear(N, output_dim), with N = hidden_dim; the
    layers are named ``inp``, ``norm`` (the RMSNorm and the SiLU) and ``out``; its inputs must have the
    parameters' dtype (``network_input``). ``transformer``: ``transformer.Transformer`` over the 256 byte
    values, with ``dim``, ``layers``, ``heads``, ``mlp_hidden``, windows of up to ``seq_len`` tokens and
    q/k norm when ``qk_norm``; its inputs are token ids."""
    if kind == "transformer":
        net = Transformer(
            VOCAB_SIZE, dim, layers, heads, mlp_hidden, seq_len, norm_impl, eps, bool(qk_norm), norm_fallback
        )
    elif kind == "mlp":
        net = nn.Sequential(
            OrderedDict(
                inp=nn.Linear(input_dim, hidden_dim),
                norm=RMSNorm(hidden_dim, eps=eps, impl=norm_impl, fallback=norm_fallback, activation="silu"),
                out=nn.Linear(hidden_dim, output_dim),
            )
        )
    else:
        raise ValueError(f"build_network: kind is {kind!r}; accepted: mlp, transformer")
    return net.to(getattr(torch, dtype))


def network_input(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``net`` takes it: floating inputs in its parameters' dtype, token ids as they are."""
    return x.to(next(net.parameters()).dtype) if x.is_floating_point() else x


def sharded(net: nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``, under ``trainer.strategy=fsdp2``) manages ``net``."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(net, FSDPModule)


def whole_state_dict(net: nn.Module) -> dict[str, torch.Tensor]:
    """``net``'s state dict with every tensor whole, on its device: a network sharded by FSDP2 has its
    parameters gathered from every process, so then every process must call this."""
    if not sharded(net):
        return net.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))


def network_copy(net: nn.Module, **kwargs) -> nn.Module:
    """A whole, unsharded copy of ``net`` with its weights (``whole_state_dict``): ``build_network(**kwargs)``
    with the random generators left as they were, so that making a copy changes no later draw."""
    with torch.random.fork_rng(devices=[]):  # the copy's own initialisation is overwritten anyway
        copy = build_network(**kwargs)
    copy.load_state_dict(whole_state_dict(net))
    return copy


def norm_layers(net: nn.Module) -> list[tuple[str, RMSNorm]]:
    """Every RMSNorm of ``net``, with its name, in the order ``named_modules`` gives."""
    return [(name, m) for name, m in net.named_modules() if isinstance(m, RMSNorm)]


def fallback_count(net: nn.Module) -> int:
    """Calls of all of ``net``'s norms that the Triton contract sent to the reference (``norm.fallback``)."""
    return sum(m.fallback_count for _, m in norm_layers(net))


def norm_calls_per_step(kind: str, layers: int | None = None, qk_norm: bool | None = None) -> int:
    """RMSNorm calls in one forward of the network (as many backward in a training step)."""
    return rmsnorm_calls(layers, bool(qk_norm)) if kind == "transformer" else 1


#: What each kind's training minimises, and the name its metrics take (``train/<name>``, ...).
LOSS_NAMES = {"mlp": "mse", "transformer": "loss"}


def loss(kind: str, out: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training loss of ``kind``, computed in float32: the MSE of the regression, the cross-entropy of
    next-byte prediction (over every token of every window)."""
    if kind == "transformer":
        return F.cross_entropy(out.float().flatten(0, -2), target.flatten(), reduction=reduction)
    return F.mse_loss(out.float(), target.float(), reduction=reduction)
