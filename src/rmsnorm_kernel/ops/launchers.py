"""The launchers: plan a call (``launch.py``), allocate its outputs and run the kernels of ``kernels.py``.

The launchers run eagerly, and also while ``torch.compile`` traces the registered op with fake tensors
(``op.py``), with ``launch=torch.library.wrap_triton``: every kernel launch then goes into the graph, and
the launch plan is made once, at trace time. Their Python is written for both: shapes and strides that
the plan needs as numbers are read with ``int()`` (under ``dynamic=True`` that specializes N, which the
kernels are compiled for anyway; the row count stays symbolic). Inductor's code passes eps as a float64
scalar: the kernels round it to float32 (``tl.cast(eps, tl.float32)``), as a Python float launched directly
is.

The launchers assume arguments that passed ``contract.check_forward``. An x with no rows launches no
kernel (a grid of zero programs is an error in some Triton versions, and there is nothing to compute):
y and dx come back empty, dgamma as zeros (a sum over no rows).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from . import kernels, looped_kernels
from .launch import SUM_BLOCK_P, SUM_WARPS, Plan, plan_for, vector_width
from .reference import output_dtype, residual_dtype

#: The kernels each direction launches, by name (how they appear in code that torch.compile generates).
FORWARD_KERNELS = ("_rmsnorm_fwd_kernel", "_rmsnorm_fwd_chunked_kernel")
BACKWARD_KERNELS = (
    "_rmsnorm_bwd_kernel",
    "_rmsnorm_bwd_reread_kernel",
    "_rmsnorm_bwd_row_stats_kernel",
    "_rmsnorm_bwd_looped_kernel",
    "_dgamma_column_sum_kernel",
)


def rows_at_one_stride(t: torch.Tensor) -> bool:
    """Whether the kernels can read ``t`` of shape (..., N) in place: its last dimension contiguous (or N =
    1) and its leading dimensions one row index with a single stride (each leading dimension of more than
    one element steps by the next one's size times its stride). False for ``x.t()``, or for q of shape
    (B, H, T, D) taken by ``transpose(1, 2)`` from (B, T, H, D)."""
    shape, strides = t.shape, t.stride()
    if shape[-1] != 1 and strides[-1] != 1:
        return False
    if len(shape) <= 2:  # one leading dimension at most: one row stride (checked on every call: kept short)
        return True
    lead = [(size, stride) for size, stride in zip(shape[:-1], strides[:-1]) if size != 1]
    return all(outer == size * stride for (_, outer), (size, stride) in zip(lead, lead[1:]))


def as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """(..., N) as a (rows, N) view with a unit column stride; a contiguous copy only where
    ``rows_at_one_stride`` says no such view exists (autograd's dy may be so)."""
    if t.numel() and not rows_at_one_stride(t):
        t = t.contiguous()
    return t.reshape(-1, n) if t.dim() != 2 else t


def direct(kernel):
    """The launchers' default ``launch``: the kernel itself."""
    return kernel


def _empty_like_contiguous(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if x.is_contiguous() and dtype in (None, x.dtype):
        return torch.empty_like(x)  # the cheaper call
    return torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)


def rmsnorm_forward(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    p: Plan | None = None,
    launch: Callable = direct,
    activation: str | None = None,
    mode: str = "torch",
    residual: torch.Tensor | None = None,
    residual_in_fp32: bool = False,
):
    """y = rmsnorm(x) * gamma, contiguous, for x of shape (..., N) with rows at one stride; silu(y) with
    ``activation="silu"``; in ``mode``'s numerics and ``reference.output_dtype``. With a ``residual`` of
    x's shape: ``(y, h)``, where h = x + residual in ``reference.residual_dtype`` and y is the norm of h
    as stored, in x's ``output_dtype`` still (a float32 h of ``residual_in_fp32`` leaves y in x's
    dtype). ``launch(kernel)`` gives what is launched: the kernel itself, or ``wrap_triton(kernel)``
    while torch.compile traces."""
    h_dtype = x.dtype if residual is None else residual_dtype(x.dtype, residual.dtype, residual_in_fp32)
    y = torch.empty(x.shape, dtype=output_dtype(x.dtype, gamma.dtype, mode), device=x.device)
    h = None if residual is None else torch.empty(x.shape, dtype=h_dtype, device=x.device)
    if x.numel() == 0:
        return y if h is None else (y, h)
    n = int(x.shape[-1])
    gamma = gamma.contiguous()  # the kernels read gamma as N consecutive elements
    x2 = as_rows(x, n)
    rows = x2.shape[0]
    # Without a residual the norm's input H is x itself; with one, RES and H are read and written too.
    res2 = x2 if residual is None else as_rows(residual, n)
    h2 = x2 if h is None else h.view(-1, n)
    # of the tensors launched on: a plan passed in may come from another layout
    vec = vector_width(n, x2, res2, traced=launch is not direct)
    p = p or plan_for(x2, gamma, vec, residual=h is not None)
    if p.fwd_two_pass:
        launch(kernels._rmsnorm_fwd_chunked_kernel)[(p.fwd_programs,)](
            x2,
            res2,
            h2,
            gamma,
            y,
            n,
            x2.stride(0),
            res2.stride(0),
            h2.stride(0),
            n,
            eps,
            BLOCK_N=p.block_n,
            STAGES=p.fwd_stages,
            EVEN_N=n % p.block_n == 0,
            VEC=vec,
            SILU=activation == "silu",
            ROUND_NORM=mode == "llama",
            WEIGHT_OFFSET=mode == "gemma",
            RESIDUAL=h is not None,
            FP64=h_dtype == torch.float64,
            num_warps=p.fwd_warps,
        )
    else:
        launch(kernels._rmsnorm_fwd_kernel)[(p.fwd_programs,)](
            x2,
            res2,
            h2,
            gamma,
            y,
            rows,
            n,
            x2.stride(0),
            res2.stride(0),
            h2.stride(0),
            n,
            eps,
            BLOCK_M=p.fwd_block_m,
            BLOCK_N=p.block_n,
            STAGES=p.fwd_stages,
            VEC=vec,
            SILU=activation == "silu",
            ROUND_NORM=mode == "llama",
            WEIGHT_OFFSET=mode == "gemma",
            RESIDUAL=h is not None,
            FP64=h_dtype == torch.float64,
            num_warps=p.fwd_warps,
        )
    return y if h is None else (y, h)


def rmsnorm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    p: Plan | None = None,
    launch: Callable = direct,
    activation: str | None = None,
    mode: str = "torch",
    dh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dgamma in gamma's dtype) for dy and x of the same shape (..., N); with
    ``activation="silu"``, dy is the gradient of the forward's silu(y); in ``mode``'s numerics. With
    ``dh`` (x is then h = x + residual, which the forward also returned, and dh that output's gradient),
    dx is h's whole gradient, the norm's plus dh: the gradient of both x and the residual.
    An x with no rows launches nothing, and dgamma, a sum over no rows, is zeros. ``launch`` as in
    ``rmsnorm_forward``."""
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.zeros_like(gamma)
    n = int(x.shape[-1])
    gamma = gamma.contiguous()  # the kernels read gamma as N consecutive elements
    x2 = as_rows(x, n)
    dy2 = as_rows(dy, n)  # autograd may hand over any layout, e.g. a broadcast (stride-0) gradient
    rows = x2.shape[0]
    dx = _empty_like_contiguous(x)
    dgamma = torch.empty_like(gamma)
    # VEC of the tensors launched on: autograd may hand back a saved x in another layout than the one
    # the forward planned for (saved-tensor hooks), and dy has any layout.
    dh2 = dy2 if dh is None else as_rows(dh, n)  # read only with HAS_DH
    vec = vector_width(n, x2, dy2, dh2, traced=launch is not direct)
    # The backward's settings do not depend on the vector width; with dh they leave room for its loads.
    p = p or plan_for(x2, gamma, vec, residual=dh is not None)
    sdy, sx, sdh = dy2.stride(0), x2.stride(0), dh2.stride(0)
    fp64 = x.dtype == torch.float64  # computed in float64, as the oracle computes float64
    if p.looped:
        rstd = torch.empty(rows, dtype=torch.float64 if fp64 else torch.float32, device=x.device)
        coef = torch.empty(rows, dtype=torch.float64 if fp64 else torch.float32, device=x.device)
        partial = torch.empty((p.partial_rows, n), dtype=torch.float64, device=x.device)
        launch(looped_kernels._rmsnorm_bwd_row_stats_kernel)[(rows,)](
            dy2,
            x2,
            gamma,
            rstd,
            coef,
            n,
            sdy,
            sx,
            eps,
            BLOCK_N=p.stats_block_n,
            STAGES=p.bwd_stages,
            VEC=vec,
            SILU=activation == "silu",
            ROUND_NORM=mode == "llama",
            WEIGHT_OFFSET=mode == "gemma",
            FP64=fp64,
            num_warps=p.stats_warps,
        )
        launch(looped_kernels._rmsnorm_bwd_looped_kernel)[p.bwd_grid](
            dy2,
            x2,
            dh2,
            gamma,
            dx,
            partial,
            rstd,
            coef,
            rows,
            n,
            sdy,
            sx,
            sdh,
            n,
            BLOCK_M=p.bwd_block_m,
            BLOCK_N=p.bwd_block_n,
            STAGES=p.bwd_stages,
            VEC=vec,
            SILU=activation == "silu",
            ROUND_NORM=mode == "llama",
            WEIGHT_OFFSET=mode == "gemma",
            HAS_DH=dh is not None,
            FP64=fp64,
            num_warps=p.bwd_warps,
        )
    else:
        partial = torch.empty((p.partial_rows, n), dtype=torch.float64, device=x.device)
        kernel = kernels._rmsnorm_bwd_reread_kernel if p.bwd_reread else kernels._rmsnorm_bwd_kernel
        whole_rows = {} if p.bwd_reread else {"BLOCK_M": p.bwd_block_m}
        launch(kernel)[p.bwd_grid[:1]](
            dy2,
            x2,
            dh2,
            gamma,
            dx,
            partial,
            rows,
            n,
            sdy,
            sx,
            sdh,
            n,
            eps,
            **whole_rows,
            BLOCK_N=p.bwd_block_n,
            BLOCK_N2=p.bwd_block_n2,
            STAGES=p.bwd_stages,
            VEC=vec,
            SILU=activation == "silu",
            ROUND_NORM=mode == "llama",
            WEIGHT_OFFSET=mode == "gemma",
            HAS_DH=dh is not None,
            FP64=fp64,
            ROWWISE_DGAMMA=p.bwd_rowwise_dgamma,
            num_warps=p.bwd_warps,
        )
    launch(kernels._dgamma_column_sum_kernel)[(triton.cdiv(n, p.sum_block_n),)](
        partial,
        dgamma,
        p.partial_rows,
        n,
        BLOCK_P=SUM_BLOCK_P,
        BLOCK_N=p.sum_block_n,
        FP64=fp64,
        num_warps=SUM_WARPS,
    )
    return dx, dgamma
