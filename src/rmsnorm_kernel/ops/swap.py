"""``swap_rmsnorm(model)``: every RMSNorm of a model made, in place, this package's ``RMSNorm``.

It knows ``torch.nn.RMSNorm`` and the RMSNorm modules of transformers' Llama, Mistral, Qwen2, Qwen3
(q_norm and k_norm included) and Gemma (1, 2 and 3) families, by class name, without importing
transformers. Each norm is converted in place: the module object stays and its class becomes this
package's ``RMSNorm``, with the original's eps and the numerics of its forward (``MODES``). So everything
the module holds stays with it: its weight (the same ``Parameter``: an optimizer built before the swap,
and weights tied elsewhere, still see it, on its device and in its dtype), its training mode, its hooks
(forward, pre-forward, backward, state-dict and load-state-dict hooks, whose handles still remove them),
and every reference to it (under every name it is held by, the model itself included when the model is
a norm). A norm it knows that the path asked for would refuse at its first forward is left as it is and
named, with the reason (``swap_rmsnorm`` says which). Any other module whose class name says RMSNorm is
left alone and named in the result. Both are named in a warning too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils import parametrize

from .backend import kernel_device_type
from .contract import ContractError, check_forward
from .impls import FALLBACKS, IMPLS
from .module import RMSNorm, default_eps

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

#: The attributes every ``nn.Module`` has: a conversion keeps the module's own (training mode, parameters,
#: buffers, submodules, hooks) and sets the others that a new ``RMSNorm`` has.
_MODULE_STATE = frozenset(vars(nn.Module()))


@dataclass
class Swapped:
    """What ``swap_rmsnorm`` did, by module name (as ``model.named_modules()`` gives it, every name under
    which a module is held; ``""`` is the model itself)."""

    #: name -> the class it replaced
    replaced: dict[str, str] = field(default_factory=dict)
    #: name -> the impl a module of this package had before the swap set the one asked for
    retargeted: dict[str, str] = field(default_factory=dict)
    #: name -> the class of a module that looks like an RMSNorm but is not one it knows
    left_alone: dict[str, str] = field(default_factory=dict)
    #: name -> why a norm it knows was left as it is
    refused: dict[str, str] = field(default_factory=dict)


def _triton_refusal(shape: tuple[int, ...], eps: float | None, weight: torch.Tensor | None) -> str | None:
    """What the Triton path's contract (``contract.check_forward``) refuses in a norm over ``shape`` with this
    eps and weight, or None if it takes it. It judges what the module fixes (N, the product of ``shape``;
    eps; the weight's dtype) on an x with no rows, in float32, on the kernels' device: x's own dtype and
    device are checked at each forward."""
    n = math.prod(shape)
    device = kernel_device_type()
    x = torch.empty((0, n), device=device)
    gamma = torch.empty((), device=device, dtype=torch.float32 if weight is None else weight.dtype).expand(n)
    try:
        check_forward(x, gamma, default_eps(torch.float32) if eps is None else eps)
    except ContractError as e:
        return f"the Triton path would refuse it at its first forward: {e}"
    return None


def _template(module: nn.Module, impl: str, fallback: str | None) -> RMSNorm | str | None:
    """An ``RMSNorm`` (on the meta device) computing what ``module`` computes, whose attributes a conversion
    gives ``module``; the reason a norm it knows is left as it is; or None for a module it does not know."""
    cls = type(module)
    if isinstance(module, nn.RMSNorm):
        shape, eps, affine, mode = module.normalized_shape, module.eps, module.elementwise_affine, "torch"
    elif cls.__name__ in TRANSFORMERS_NORMS and cls.__module__.startswith("transformers."):
        mode, eps_attribute = TRANSFORMERS_NORMS[cls.__name__]
        shape, eps, affine = tuple(module.weight.shape), getattr(module, eps_attribute), True
    else:
        return None
    if "forward" in vars(module):
        return "its forward is set on the module itself (as accelerate's hooks set it), which a conversion would bypass"
    if parametrize.is_parametrized(module):
        return "its weight is parametrized (torch.nn.utils.parametrize), which a conversion would drop"
    try:
        template = RMSNorm(shape, eps, affine, device="meta", impl=impl, fallback=fallback, mode=mode)
    except ValueError as e:  # a shape torch takes and this package does not: a zero, or no dimension
        return str(e)
    if impl == "triton" and fallback is None:
        return _triton_refusal(template.normalized_shape, eps, module.weight) or template
    return template


def _convert(module: nn.Module, template: RMSNorm) -> None:
    """Make ``module`` an ``RMSNorm`` in place: the attributes ``template`` has beyond a bare ``nn.Module``'s,
    then its class; what every module holds (parameters, training mode, hooks) stays the module's."""
    for key, value in vars(template).items():
        if key not in _MODULE_STATE:
            setattr(module, key, value)
    module.__class__ = RMSNorm


def swap_rmsnorm(model: nn.Module, *, impl: str = "triton", fallback: str | None = None) -> Swapped:
    """Convert, in place, every RMSNorm of ``model`` that this package knows (see the module's doc) into
    ``RMSNorm(..., impl=impl, fallback=fallback)`` with the same weight, eps and numerics, and set
    ``impl`` and ``fallback`` on the modules of this package it finds (a second swap changes the path);
    return what it did. A module held under several names is converted once and named under all of them.
    ``model`` itself is one of the modules: a norm passed as the model is converted (or retargeted) in
    place like any other, under the name ``""`` (``model.named_modules()``'s name for the root), so the
    caller's reference is the converted module.

    A norm it knows is left as it is, and named in ``refused`` with the reason, when the path asked for
    would refuse it at its first forward: on ``impl="triton"`` without a fallback, a norm whose row length
    (the product of its shape), eps or weight dtype the Triton path's contract refuses (``contract.py``
    decides; torch takes ``eps=0`` and rows of any length); on any path, a shape with a zero or no
    dimension. With ``fallback="reference"`` such a norm is converted, and its calls go to the reference.
    A norm whose forward is set on the module itself (as accelerate's hooks set it), or whose weight is
    parametrized (``torch.nn.utils.parametrize``), is left as it is too. Nothing is changed until every
    module has been looked at.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_rmsnorm: model is a {type(model).__name__}; accepted: a torch.nn.Module")
    if impl not in IMPLS:
        raise ValueError(f"swap_rmsnorm: impl is {impl!r}; accepted: {', '.join(map(repr, IMPLS))}")
    if fallback not in FALLBACKS:
        raise ValueError(f"swap_rmsnorm: fallback is {fallback!r}; accepted: None or 'reference'")
    done = Swapped()
    plan: dict[int, tuple[nn.Module, RMSNorm | None]] = {}  # by id: the module, its template (None: retarget)
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if id(module) in plan:
            decision = plan[id(module)]
        elif isinstance(module, RMSNorm):
            reason = None
            if impl == "triton" and fallback is None:
                reason = _triton_refusal(module.normalized_shape, module.eps, module.weight)
            if reason is not None:
                done.refused[name] = reason
                continue
            decision = plan[id(module)] = (module, None)
        else:
            made = _template(module, impl, fallback)
            if made is None:
                if "rmsnorm" in type(module).__name__.lower():
                    done.left_alone[name] = type(module).__name__
                continue
            if isinstance(made, str):
                done.refused[name] = made
                continue
            decision = plan[id(module)] = (module, made)
        module, made = decision
        if made is None:
            done.retargeted[name] = module.impl
        else:
            done.replaced[name] = type(module).__name__
    for module, made in plan.values():
        if made is None:
            module.impl, module.fallback = impl, fallback
        else:
            _convert(module, made)
    for name, cls in done.left_alone.items():
        log.warning("swap_rmsnorm: %s is a %s, which it does not know; left alone", name, cls)
    for name, reason in done.refused.items():
        log.warning("swap_rmsnorm: %s left as it is: %s", name, reason)
    return done
