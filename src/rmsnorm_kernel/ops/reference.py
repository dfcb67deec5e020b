"""The oracle: RMSNorm written as plainly as PyTorch allows, and its backward written out by hand.

    r  = rsqrt(mean(x^2 over the last dim) + eps)      one value per row
    n  = x * r                                          the normalized x
    y  = n * gamma

Backward, with u = dy * gamma and means taken over the N columns of a row:

    dx     = r * u - x * r^3 * mean(u * x)
    dgamma = sum over rows of (dy * n)                  a sum over rows, never a mean

Numerics modes (``mode``): the same formula as each family of models computes it.

- ``"torch"`` (the default), as ``torch.nn.RMSNorm``: float32 inside (float64 for float64 x), one rounding
  to x's dtype at the end.
- ``"llama"``, as ``LlamaRMSNorm`` (Mistral's, Qwen2's and Qwen3's are the same code): n is rounded to
  x's dtype before the weight multiplies it, and y takes the dtype that torch promotes x's and the
  weight's to (float32 for a bfloat16 x and a float32 weight). The backward treats that rounding as
  autograd does, as the identity: dx is the formula above, dgamma sums dy * round(n).
- ``"gemma"``, as ``GemmaRMSNorm``: the scale is ``gamma = 1 + weight`` in float32, so a weight of zeros
  (how Gemma initialises it) leaves n unscaled; d weight = dgamma above.

With ``activation="silu"`` the norm is followed by SiLU inside the same call, ``z = silu(y) = y * sigmoid(y)``
(the network's next layer, fused: y never leaves the computation), and its backward first takes the
gradient through the SiLU, then the formulas above with dy replaced by

    dy_y   = dz * silu'(y),   silu'(y) = s * (1 + y * (1 - s)),  s = sigmoid(y)

where y is the unrounded ``n * gamma``.

With a residual (the add before the norm of a pre-norm transformer block), ``h = x + residual`` is
computed first, in ``residual_dtype``, and returned; y is the norm of h as stored, in the dtype it has
without a residual (``output_dtype`` of x, so a float32 h leaves a bfloat16 y bfloat16). The gradient of h is
the norm's (above, with x = h) plus that of h itself, and an add passes it to x and residual alike.

``oracle`` is what every comparison of this project checks against: these formulas in float64.
"""

from __future__ import annotations

import torch

DEFAULT_EPS = 1e-6
#: What may follow the norm in the same call: nothing, or SiLU.
ACTIVATIONS = (None, "silu")
#: The numerics modes, the default first.
MODES = ("torch", "llama", "gemma")


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 inputs are computed in float64; everything else in float32 (half formats lose too much)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def output_dtype(x_dtype: torch.dtype, gamma_dtype: torch.dtype, mode: str = "torch") -> torch.dtype:
    """y's dtype: x's, except in ``"llama"`` mode, where the weight multiplies a tensor of x's dtype and
    torch's type promotion decides."""
    return torch.promote_types(x_dtype, gamma_dtype) if mode == "llama" else x_dtype


def residual_dtype(x_dtype: torch.dtype, res_dtype: torch.dtype, residual_in_fp32: bool = False) -> torch.dtype:
    """The dtype of h = x + residual: torch's promotion of the two, or float32 with ``residual_in_fp32``
    (the residual stream kept in float32 between layers, as flash-attention's option does)."""
    return torch.float32 if residual_in_fp32 else torch.promote_types(x_dtype, res_dtype)


def _normalized(xc: torch.Tensor, eps: float, mode: str, x_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, n) of x given in its compute dtype; in ``"llama"`` mode n is rounded to ``x_dtype`` (x's own)."""
    r = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)
    n = xc * r
    if mode == "llama":
        n = n.to(x_dtype).to(xc.dtype)
    return r, n


def _scale(gamma: torch.Tensor, ct: torch.dtype, mode: str) -> torch.Tensor:
    """What multiplies n: gamma, or ``1 + gamma`` in ``"gemma"`` mode."""
    g = gamma.to(ct)
    return g + 1 if mode == "gemma" else g


def _check_choices(activation, mode) -> None:
    """The oracle computes only the activations and modes it defines: anything else is a ValueError, not
    the default numerics under another name."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"reference: activation is {activation!r}; accepted: {' or '.join(map(repr, ACTIVATIONS))}")
    if mode not in MODES:
        raise ValueError(f"reference: mode is {mode!r}; accepted: {' or '.join(map(repr, MODES))}")


def _forward(x, gamma, eps, activation, mode, x_dtype) -> torch.Tensor:
    _check_choices(activation, mode)
    ct = compute_dtype(x)
    _, n = _normalized(x.to(ct), eps, mode, x_dtype)
    y = n * _scale(gamma, ct, mode)
    if activation == "silu":
        y = y * torch.sigmoid(y)
    return y


def rmsnorm_reference(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
) -> torch.Tensor:
    """``y = x * rsqrt(mean(x^2) + eps) * gamma`` over the last dimension (then ``silu(y)`` with
    ``activation="silu"``), in ``mode``'s numerics, returned in ``output_dtype``."""
    return _forward(x, gamma, eps, activation, mode, x.dtype).to(output_dtype(x.dtype, gamma.dtype, mode))


def silu_grad(y: torch.Tensor) -> torch.Tensor:
    """d silu(y) / dy = s * (1 + y * (1 - s)), s = sigmoid(y)."""
    s = torch.sigmoid(y)
    return s * (1 + y * (1 - s))


def _backward(x, gamma, dy, eps, activation, mode, x_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    _check_choices(activation, mode)
    ct = compute_dtype(x)
    n_cols = x.shape[-1]
    xc, dyc = x.to(ct), dy.to(ct)
    g = _scale(gamma, ct, mode)
    r, n = _normalized(xc, eps, mode, x_dtype)
    if activation == "silu":
        dyc = dyc * silu_grad(n * g)
    u = dyc * g
    dx = r * u - xc * r.pow(3) * (u * xc).sum(dim=-1, keepdim=True) / n_cols
    dgamma = (dyc * n).reshape(-1, n_cols).sum(dim=0)
    return dx, dgamma


def manual_backward(
    x: torch.Tensor,
    gamma: torch.Tensor,
    dy: torch.Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit backward formulas (no autograd): returns ``(dx, dgamma)`` in x's and gamma's dtypes.
    With ``activation="silu"``, dy is the gradient of the SiLU's output."""
    dx, dgamma = _backward(x, gamma, dy, eps, activation, mode, x.dtype)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


@torch.no_grad()
def oracle(
    x: torch.Tensor,
    gamma: torch.Tensor,
    dy: torch.Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dgamma): the formulas above evaluated in float64, rounded to y's (``output_dtype``), x's and
    gamma's dtypes. In ``"llama"`` mode n is still rounded to x's own dtype, as the model does.

    float64 rather than float32 for every dtype: dgamma sums over many rows, and a float32 sum of
    32768 rows is itself off by about float32's declared tolerance, so a float32 oracle could fail an
    exact answer.
    """
    xd, gd, dyd = x.double(), gamma.double(), dy.double()
    y = _forward(xd, gd, eps, activation, mode, x.dtype)
    dx, dgamma = _backward(xd, gd, dyd, eps, activation, mode, x.dtype)
    return y.to(output_dtype(x.dtype, gamma.dtype, mode)), dx.to(x.dtype), dgamma.to(gamma.dtype)


def add_rmsnorm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    gamma: torch.Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
    residual_in_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): h = x + residual in ``residual_dtype``, y = ``rmsnorm_reference(h, ...)`` in x's
    ``output_dtype``."""
    hd = residual_dtype(x.dtype, residual.dtype, residual_in_fp32)
    h = x.to(hd) + residual.to(hd)
    y = rmsnorm_reference(h, gamma, eps, activation, mode)
    return y.to(output_dtype(x.dtype, gamma.dtype, mode)), h


@torch.no_grad()
def add_oracle(
    x: torch.Tensor,
    residual: torch.Tensor,
    gamma: torch.Tensor,
    dy: torch.Tensor,
    dh: torch.Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
    residual_in_fp32: bool = False,
) -> tuple[torch.Tensor, ...]:
    """(y, h, dx, dresidual, dgamma) of the norm with a residual, for the gradients dy of y and dh of h:
    h exactly as ``add_rmsnorm_reference`` makes it (one rounded add), the rest in float64 as ``oracle``,
    rounded to y's, h's, x's, residual's and gamma's dtypes."""
    _, h = add_rmsnorm_reference(x, residual, gamma, eps, activation, mode, residual_in_fp32)
    hd, gd, dyd = h.double(), gamma.double(), dy.double()
    y = _forward(hd, gd, eps, activation, mode, h.dtype)
    dh_norm, dgamma = _backward(hd, gd, dyd, eps, activation, mode, h.dtype)
    dh_total = dh_norm + dh.double()
    return (
        y.to(output_dtype(x.dtype, gamma.dtype, mode)),
        h,
        dh_total.to(x.dtype),
        dh_total.to(residual.dtype),
        dgamma.to(gamma.dtype),
    )
