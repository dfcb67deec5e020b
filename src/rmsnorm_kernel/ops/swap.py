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

from .impls import FALLBACKS, IMPLS
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
    """What ``swap_rmsnorm`` did, by module name (as ``model.named_modules()`` gives it, every name under
    which a module is held)."""

    #: name -> the class it replaced
    replaced: dict[str, str] = field(default_factory=dict)
    #: name -> the impl a module of this package had before the swap set the one asked for
    retargeted: dict[str, str] = field(default_factory=dict)
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
    ``RMSNorm(..., impl=impl, fallback=fallback)`` with the same weight, eps and numerics, and set
    ``impl`` and ``fallback`` on the modules of this package it finds (a second swap changes the path);
    return what it did. A module held under several names is replaced by one module under all of them."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_rmsnorm: model is a {type(model).__name__}; accepted: a torch.nn.Module")
    if impl not in IMPLS:
        raise ValueError(f"swap_rmsnorm: impl is {impl!r}; accepted: {', '.join(map(repr, IMPLS))}")
    if fallback not in FALLBACKS:
        raise ValueError(f"swap_rmsnorm: fallback is {fallback!r}; accepted: None or 'reference'")
    done = Swapped()
    made: dict[int, RMSNorm] = {}  # replacements, by the id of the module they replace
    previous_impl: dict[int, str] = {}  # this package's modules met, by id: their impl before the swap
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not name:
            continue  # the model itself
        if isinstance(module, RMSNorm):
            done.retargeted[name] = previous_impl.setdefault(id(module), module.impl)
            module.impl, module.fallback = impl, fallback
            continue
        new = made.get(id(module)) or _replacement(module, impl, fallback)
        if new is None:
            if "rmsnorm" in type(module).__name__.lower():
                done.left_alone[name] = type(module).__name__
            continue
        made[id(module)] = new
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, new)
        done.replaced[name] = type(module).__name__
    for name, cls in done.left_alone.items():
        log.warning("swap_rmsnorm: %s is a %s, which it does not know; left alone", name, cls)
    return done
