"""``swap_rmsnorm(model)``: every RMSNorm of a model replaced, in place, by this package's ``RMSNorm``.

It knows ``torch.nn.RMSNorm`` and the RMSNorm modules of transformers' Llama, Mistral, Qwen2, Qwen3
(q_norm and k_norm included) and Gemma (1, 2 and 3) families, by class name, without importing
transformers. Each replacement takes over the original's weight (the same ``Parameter``: an optimizer
built before the swap, and weights tied elsewhere, still see it), eps, device and dtype, and the
numerics of its forward (``MODES``). Any other module whose class name says RMSNorm is left alone and
named in the result, and in a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from torch import nn

from .module import RMSNorm

log = logging.getLogger("rmsnorm_kernel")

#: transformers' RMSNorm classes, by name: the numerics mode of their forward, and the attribute that
#: holds their eps. Their weight is ``weight``, of shape (hidden size,).
TRANSFORMERS_NORMS = {
    "LlamaRMSNorm": ("llama", "variance_epsilon"),
    "MistralRMSNorm": ("llama", "variance_epsilon"),
    "Qwen2RMSNorm": ("llama", "variance_epsilon"),
    "Qwen3RMSNorm": ("llama", "variance_epsilon"),
    "GemmaRMSNorm": ("gemma", "eps"),
    "Gemma2RMSNorm": ("gemma", "eps"),
    "Gemma3RMSNorm": ("gemma", "eps"),
}


@dataclass
class Swapped:
    """What ``swap_rmsnorm`` did, by module name (as ``model.named_modules()`` gives it)."""

    #: name -> the class it replaced
    replaced: dict[str, str] = field(default_factory=dict)
    #: name -> the class of a module that looks like an RMSNorm but is not one it knows
    left_alone: dict[str, str] = field(default_factory=dict)


def _replacement(module: nn.Module, impl: str, fallback: str | None) -> RMSNorm | None:
    """This package's RMSNorm computing what ``module`` computes, or None for a module it does not know."""
    cls = type(module)
    if isinstance(module, nn.RMSNorm):
        new = RMSNorm(module.normalized_shape, module.eps, module.elementwise_affine, impl=impl, fallback=fallback)
    elif cls.__name__ in TRANSFORMERS_NORMS and cls.__module__.startswith("transformers."):
        mode, eps_attribute = TRANSFORMERS_NORMS[cls.__name__]
        new = RMSNorm(
            module.weight.shape, getattr(module, eps_attribute), True, impl=impl, fallback=fallback, mode=mode
        )
    else:
        return None
    if new.weight is not None:
        new.weight = module.weight  # the same Parameter: its device, dtype, values and identity
    return new


def swap_rmsnorm(model: nn.Module, *, impl: str = "triton", fallback: str | None = None) -> Swapped:
    """Replace, in place, every RMSNorm of ``model`` that this package knows (see the module's doc) by
    ``RMSNorm(..., impl=impl, fallback=fallback)`` with the same weight, eps and numerics; return what was
    replaced and what was left alone. A module found under several names is replaced by one module."""
    done = Swapped()
    made: dict[int, RMSNorm] = {}
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, RMSNorm):
                continue
            new = made.get(id(child))
            if new is None:
                new = _replacement(child, impl, fallback)
            if new is None:
                if "rmsnorm" in type(child).__name__.lower():
                    done.left_alone[full] = type(child).__name__
                continue
            made[id(child)] = new
            setattr(parent, name, new)
            done.replaced[full] = type(child).__name__
    for full, cls in done.left_alone.items():
        log.warning("swap_rmsnorm: %s is a %s, which it does not know; left alone", full, cls)
    return done
