"""``RMSNorm``: ``torch.nn.RMSNorm``'s interface, computed by the Triton path, the reference or ``F.rms_norm``."""

from __future__ import annotations

import logging
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from .contract import ContractError, check_forward, residual_problem
from .impls import FALLBACKS, IMPLS
from .op import rmsnorm
from .reference import ACTIVATIONS, MODES, output_dtype, residual_dtype, rmsnorm_reference

log = logging.getLogger("rmsnorm_kernel")


def default_eps(dtype: torch.dtype) -> float:
    """The eps that ``torch.nn.RMSNorm(eps=None)`` uses for an x of ``dtype``: the machine epsilon of the
    type the computation runs in (float64 for float64, float32 for float32, float16 and bfloat16), not of
    ``dtype`` itself. Half formats are computed in float32 by every path, so their eps is float32's too."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


class RMSNorm(nn.Module):
    """``y = x * rsqrt(mean(x^2) + eps) * weight``, the mean taken over the last ``len(normalized_shape)``
    dimensions of x: a drop-in for ``torch.nn.RMSNorm``.

    The positional arguments are torch's, in torch's order and with torch's meaning, so a module, its
    ``repr`` and its state dict (one key, ``weight``, of shape ``normalized_shape``) move between the two
    classes unchanged:

    - ``normalized_shape``: an int or a sequence of positive ints, the trailing shape x must have;
    - ``eps``: added to the mean square; ``None`` (the default) takes ``default_eps(x.dtype)`` at each
      forward, as torch does;
    - ``elementwise_affine``: with ``False`` there is no parameter (``weight`` is ``None``) and every
      path computes the unscaled norm;
    - ``device``, ``dtype``: where and in what dtype the weight is created.

    ``impl`` (keyword only) picks the computation (``impls.IMPLS``): ``"triton"`` (the kernels),
    ``"reference"`` (the oracle) or ``"native"`` (``torch.nn.functional.rms_norm``). Every path creates the
    same parameter the same way and draws nothing from the random generator, so swapping paths never
    changes the initial weights.

    The kernels and the reference normalize over one last dimension, so these paths see x as
    ``(..., N)`` with N the product of ``normalized_shape`` and the weight as ``(N,)``, and give y back
    in x's shape. Viewing costs nothing when the trailing dimensions flatten (a contiguous x, or a slice
    of one along a leading dimension); otherwise ``reshape`` copies x once. Without a weight these paths
    multiply by a ones tensor of N elements in x's dtype, made once per (device, dtype) and kept (see
    ``_ones``); multiplying by one is exact, so the result is the unscaled norm.

    ``mode`` (keyword only) picks the numerics of ``reference.MODES`` on every path: ``"torch"`` (the
    default, ``torch.nn.RMSNorm``'s), ``"llama"`` (``LlamaRMSNorm``'s, and Mistral's and Qwen's: the
    normalized x rounded to x's dtype before the weight, y in the promoted dtype) or ``"gemma"``
    (``GemmaRMSNorm``'s: the scale is ``1 + weight``, and the weight starts at zeros). The native path
    computes them as those modules do, from ``F.rms_norm``. Without a weight every mode is the unscaled
    norm, rounded once.

    ``activation="silu"`` (keyword only, None by default) makes the module compute ``silu(rmsnorm(x))``: the
    SiLU that follows the norm in a network, in the same call. The Triton path computes both in the same
    kernels, so the norm's output is never written to memory and read back, in either direction (as
    ``torch.compile`` fuses them); the reference applies SiLU before rounding to x's dtype, and the
    native path calls ``F.silu`` on ``F.rms_norm``'s output.

    ``fallback="reference"`` (keyword only, off by default) sends inputs that the Triton path's contract
    refuses to the reference instead of raising ``ContractError``. Each such call is counted in
    ``fallback_count``, and the first one logs its reason as a warning.

    Differences from torch: a ``normalized_shape`` with a zero or negative entry, or no entry, is refused
    at construction (``ValueError``), where torch refuses some only at forward and runs a zero.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: tuple[int, ...]
    eps: float | None
    elementwise_affine: bool

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        impl: str = "triton",
        fallback: str | None = None,
        activation: str | None = None,
        mode: str = "torch",
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl is {impl!r}; accepted: {', '.join(map(repr, IMPLS))}")
        if fallback not in FALLBACKS:
            raise ValueError(f"RMSNorm: fallback is {fallback!r}; accepted: None or 'reference'")
        if mode not in MODES:
            raise ValueError(f"RMSNorm: mode is {mode!r}; accepted: {' or '.join(map(repr, MODES))}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"RMSNorm: activation is {activation!r}; accepted: {' or '.join(map(repr, ACTIVATIONS))}")
        self.normalized_shape = _checked_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.impl = impl
        self.fallback = fallback
        self.activation = activation
        self.mode = mode
        self.fallback_count = 0
        #: ones of N elements per (device, dtype) of x, the weight of the kernels and the reference
        #: when there is none; not a buffer, so that the state dict stays torch's
        self._ones: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the weight to ones, as torch does, or to zeros in ``"gemma"`` mode, as Gemma does (a scale of
        1 either way); draw nothing from the random generator."""
        if self.weight is not None:
            (nn.init.zeros_ if self.mode == "gemma" else nn.init.ones_)(self.weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, residual_in_fp32: bool = False):
        """y, or ``(y, h)`` with a ``residual``: h = x + residual (in torch's promoted dtype, float32 with
        ``residual_in_fp32``) and y the norm of h in the dtype y has without a residual, the add and norm of
        a pre-norm block; the Triton path does both in the same kernels (with ``fallback="reference"``, where
        the contract accepts x and the residual; elsewhere it adds in torch and normalizes h as without one)."""
        if residual is not None or residual_in_fp32 is not False:
            problem = residual_problem(x, residual, residual_in_fp32, kernels=False)
            if problem is not None:
                raise ValueError("RMSNorm: {} {}; accepted: {}".format(*problem))
            if self.impl == "triton":
                x2, w, eps, mode = self._rows(x)
                r2 = residual.reshape(x2.shape)
                accepted = _refusal(x2, w, eps) is None and residual_problem(x2, r2, residual_in_fp32) is None
                if self.fallback is None or accepted:
                    y, h = rmsnorm(x2, w, eps, self.activation, mode, residual=r2, residual_in_fp32=residual_in_fp32)
                    return y.reshape(x.shape), h.reshape(x.shape)
            h_dtype = residual_dtype(x.dtype, residual.dtype, residual_in_fp32)
            h = x.to(h_dtype) + residual.to(h_dtype)
            return self.forward(h).to(self._output_dtype(x.dtype)), h  # forward: hooks fire once a call
        if self.impl == "native":
            self._check_trailing_shape(x)
            y = self._native(x)
            return F.silu(y) if self.activation == "silu" else y
        x2, w, eps, mode = self._rows(x)
        if self.impl == "reference":
            y = rmsnorm_reference(x2, w, eps, self.activation, mode)
        else:
            y = self._triton(x2, w, eps, mode)
        return y if y.shape == x.shape else y.reshape(x.shape)

    def _rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, str]:
        """(x as (..., N), the weight as (N,), eps, mode) for the kernels and the reference, which normalize
        one last dimension; without a weight, ones and torch's mode (the unscaled norm in every mode)."""
        self._check_trailing_shape(x)
        eps = default_eps(x.dtype) if self.eps is None else self.eps
        n = math.prod(self.normalized_shape)
        flat = len(self.normalized_shape) == 1  # the common case: no reshape on every call
        if not flat:
            x = x.reshape(*x.shape[: x.dim() - len(self.normalized_shape)], n)
        if self.weight is None:
            return x, self._ones_like(x, n), eps, "torch"
        return x, self.weight if flat else self.weight.reshape(n), eps, self.mode

    def _output_dtype(self, x_dtype: torch.dtype) -> torch.dtype:
        """The dtype of y for an x of ``x_dtype``, on every path."""
        if self.weight is None:
            return x_dtype
        return output_dtype(x_dtype, self.weight.dtype, self.mode)

    def _native(self, x: torch.Tensor) -> torch.Tensor:
        """The norm from ``F.rms_norm``, in each mode as the module it comes from writes it."""
        shape, w, eps = self.normalized_shape, self.weight, self.eps
        if w is None or self.mode == "torch":
            return F.rms_norm(x, shape, w, eps)
        if self.mode == "llama":  # LlamaRMSNorm: weight * normalized x in x's dtype
            return w * F.rms_norm(x, shape, None, eps)
        return F.rms_norm(x.float(), shape, 1.0 + w.float(), eps).to(x.dtype)  # GemmaRMSNorm

    def _triton(self, x: torch.Tensor, w: torch.Tensor, eps: float, mode: str) -> torch.Tensor:
        """The kernels on (..., N) and (N,), or the reference for what they refuse if ``fallback`` says so."""
        if self.fallback == "reference":
            reason = _refusal(x, w, eps)
            if reason is not None:
                if self.fallback_count == 0:
                    log.warning(
                        "RMSNorm: %s; using the reference path (fallback='reference'), counted from now on", reason
                    )
                self.fallback_count += 1
                return rmsnorm_reference(x, w, eps, self.activation, mode)
        return rmsnorm(x, w, eps, self.activation, mode)

    def _check_trailing_shape(self, x: torch.Tensor) -> None:
        """Refuse an x whose trailing dimensions are not ``normalized_shape``, with the exception type that
        ``F.rms_norm`` raises for it (``ValueError`` for too few dimensions, ``RuntimeError`` otherwise),
        on every path, before anything runs."""
        k = len(self.normalized_shape)
        if x.dim() >= k and tuple(x.shape[x.dim() - k :]) == self.normalized_shape:
            return
        error = ValueError if x.dim() < k else RuntimeError
        raise error(
            f"RMSNorm: x has shape {tuple(x.shape)}; accepted: a shape (..., "
            f"{', '.join(map(str, self.normalized_shape))}) that ends in normalized_shape {self.normalized_shape}"
        )

    def _ones_like(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Ones of ``n`` elements on x's device in x's dtype, the weight when there is none.

        Made once per (device, dtype) of x and kept, so that a forward allocates nothing for them: N
        elements for each device and dtype the module has seen. They are
        made outside inference mode (an inference tensor could not be saved for a later backward) and
        never require grad. While ``torch.compile`` traces, the ones are made in the graph instead, so
        that the compiled code does not depend on, or write to, this module's Python state.
        """
        if torch.compiler.is_compiling():
            return torch.ones(n, device=x.device, dtype=x.dtype)
        key = (x.device, x.dtype)
        ones = self._ones.get(key)
        if ones is None:
            with torch.inference_mode(False):
                ones = torch.ones(n, device=x.device, dtype=x.dtype)
            self._ones[key] = ones
        return ones

    def extra_repr(self) -> str:
        """torch's ``{normalized_shape}, eps={eps}, elementwise_affine={...}``, then impl, fallback,
        activation and mode where they are not the defaults."""
        text = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.impl != "triton":
            text += f", impl={self.impl!r}"
        if self.fallback is not None:
            text += f", fallback={self.fallback!r}"
        if self.activation is not None:
            text += f", activation={self.activation!r}"
        if self.mode != "torch":
            text += f", mode={self.mode!r}"
        return text


def _checked_shape(normalized_shape) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints (an int is one dimension, as in torch), or ``ValueError``
    for anything but a non-empty sequence of positive ints."""
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
    try:
        shape = tuple(shape)
    except TypeError:
        shape = None
    if (
        not shape
        or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in shape)
        or any(d < 1 for d in shape)
    ):
        raise ValueError(
            f"RMSNorm: normalized_shape is {normalized_shape!r}; accepted: a positive int, or a non-empty "
            "sequence of positive ints (the trailing dimensions of x)"
        )
    return tuple(int(d) for d in shape)


def _refusal(x: torch.Tensor, w: torch.Tensor, eps: float) -> str | None:
    """Why the Triton path would refuse this call, or None if it accepts it."""
    try:
        check_forward(x, w, eps)
    except ContractError as e:
        return str(e)
    return None
