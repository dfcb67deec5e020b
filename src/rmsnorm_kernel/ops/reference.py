"""The oracle: RMSNorm written as plainly as PyTorch allows, and its backward written out by hand.

    r  = rsqrt(mean(x^2 over the last dim) + eps)      one value per row
    y  = x * r * gamma

Backward, with u = dy * gamma and means taken over the N columns of a row:

    dx     = r * u - x * r^3 * mean(u * x)
    dgamma = sum over rows of (dy * x * r)              a sum over rows, never a mean

With ``activation="silu"`` the norm is followed by SiLU inside the same call, ``z = silu(y) = y * sigmoid(y)``
(the network's next layer, fused: y never leaves the computation), and its backward first takes the
gradient through the SiLU, then the formulas above with dy replaced by

    dy_y   = dz * silu'(y),   silu'(y) = s * (1 + y * (1 - s)),  s = sigmoid(y)

where y is the unrounded ``x * r * gamma``.

``oracle`` is what every comparison of this project checks against: these formulas in float64.
"""

from __future__ import annotations

import torch

DEFAULT_EPS = 1e-6
#: What may follow the norm in the same call: nothing, or SiLU.
ACTIVATIONS = (None, "silu")


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 inputs are computed in float64; everything else in float32 (half formats lose too much)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rmsnorm_reference(
    x: torch.Tensor, gamma: torch.Tensor, eps: float = DEFAULT_EPS, activation: str | None = None
) -> torch.Tensor:
    """``y = x * rsqrt(mean(x^2) + eps) * gamma`` over the last dimension (then ``silu(y)`` with
    ``activation="silu"``), returned in x's dtype."""
    ct = compute_dtype(x)
    xc = x.to(ct)
    r = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = xc * r * gamma.to(ct)
    if activation == "silu":
        y = y * torch.sigmoid(y)
    return y.to(x.dtype)


def silu_grad(y: torch.Tensor) -> torch.Tensor:
    """d silu(y) / dy = s * (1 + y * (1 - s)), s = sigmoid(y)."""
    s = torch.sigmoid(y)
    return s * (1 + y * (1 - s))


def manual_backward(
    x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, eps: float = DEFAULT_EPS, activation: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit backward formulas (no autograd): returns ``(dx, dgamma)`` in x's and gamma's dtypes.
    With ``activation="silu"``, dy is the gradient of the SiLU's output."""
    ct = compute_dtype(x)
    n = x.shape[-1]
    xc, dyc, gc = x.to(ct), dy.to(ct), gamma.to(ct)
    r = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)
    if activation == "silu":
        dyc = dyc * silu_grad(xc * r * gc)
    u = dyc * gc
    dx = r * u - xc * r.pow(3) * (u * xc).sum(dim=-1, keepdim=True) / n
    dgamma = (dyc * xc * r).reshape(-1, n).sum(dim=0)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


@torch.no_grad()
def oracle(
    x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, eps: float = DEFAULT_EPS, activation: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dgamma): the formulas above evaluated in float64, rounded to x's and gamma's dtypes.

    float64 rather than float32 for every dtype: dgamma sums over many rows, and a float32 sum of
    32768 rows is itself off by about float32's declared tolerance, so a float32 oracle could fail an
    exact answer.
    """
    xd, gd, dyd = x.double(), gamma.double(), dy.double()
    y = rmsnorm_reference(xd, gd, eps, activation)
    dx, dgamma = manual_backward(xd, gd, dyd, eps, activation)
    return y.to(x.dtype), dx.to(x.dtype), dgamma.to(gamma.dtype)
