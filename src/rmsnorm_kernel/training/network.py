"""The demo network, Linear -> RMSNorm -> SiLU -> Linear: the one definition that the training, the check
commands and the tests build. Imports no Lightning, so that the check commands can rebuild it without it.

The SiLU is the norm module's ``activation``: every path computes silu(rmsnorm(h)) in the ``norm`` layer,
the Triton path in the same kernels (the norm's output never goes to memory), the native path as
``F.silu(F.rms_norm(h))``, which ``torch.compile`` fuses into one kernel of its own. A network that had a
separate SiLU layer has the same parameters and state dict: the SiLU has none."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ..ops.module import RMSNorm

#: The constructor arguments of ``build_network``, as saved in a checkpoint's hyper-parameters.
NETWORK_KEYS = ("input_dim", "hidden_dim", "output_dim", "norm_impl", "eps", "norm_fallback", "dtype")
#: Of those, the ones a checkpoint may lack, with the value it was then trained with.
NETWORK_DEFAULTS = {"dtype": "float32"}


def build_network(
    input_dim: int,
    hidden_dim: int,
    output_dim: int,
    norm_impl: str,
    eps: float,
    norm_fallback: str | None = None,
    dtype: str = "float32",
) -> nn.Sequential:
    """Linear(input_dim, N) -> RMSNorm(N) -> SiLU -> Linear(N, output_dim), with N = hidden_dim; the layers
    are named ``inp``, ``norm`` (the RMSNorm and the SiLU) and ``out``. ``dtype``: of every parameter, ``"float32"`` or
    ``"bfloat16"`` (``trainer.precision=bf16-true``); initialised in float32 and then rounded, so that both
    dtypes start from the same draws. Its inputs must have that dtype (``input_dtype``)."""
    net = nn.Sequential(
        OrderedDict(
            inp=nn.Linear(input_dim, hidden_dim),
            norm=RMSNorm(hidden_dim, eps=eps, impl=norm_impl, fallback=norm_fallback, activation="silu"),
            out=nn.Linear(hidden_dim, output_dim),
        )
    )
    return net.to(getattr(torch, dtype))


def input_dtype(net: nn.Module) -> torch.dtype:
    """The dtype a network of ``build_network`` takes its inputs in: its parameters'."""
    return next(net.parameters()).dtype
