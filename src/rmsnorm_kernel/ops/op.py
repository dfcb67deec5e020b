"""``rmsnorm()``, the Triton path as a function: one route in each direction, eager and compiled.

``rmsnorm()`` checks the contract, then takes ``_RMSNormFunction`` (``_AddRMSNormFunction`` with a
residual), whose forward and backward run ``library._forward`` and ``library._backward``: the kernels,
launched directly in eager code or through the registered ops (``library.py``) while a tracer runs. Plain
tensors outside torch.func take the same Functions in the old style (``_RMSNormEager``), which torch's
``apply`` calls without binding arguments by signature. With counting on (``counters.counting()``), the
Functions also call ``rmsnorm_kernel::count_call`` once per direction. DTensors are normalized shard by
shard (``_rmsnorm_dtensor``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import counters, launchers
from .contract import check_dtensor, check_forward, check_residual
from .launch import Plan, plan_for
from .library import _add_grads, _backward, _count, _forward, _refuse_double_backward, _through_op
from .reference import DEFAULT_EPS


def _readable(t: Tensor) -> bool:
    """Whether ``t`` has data the kernels can read: not so for the wrappers of a torch.func transform
    (``vmap``, ``grad``), which have no storage."""
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True


def _plan(x: Tensor, gamma: Tensor) -> Plan | None:
    """The launch plan of x and gamma, for both directions; none for an x with no rows, which launches
    nothing."""
    return plan_for(launchers.as_rows(x, x.shape[-1]), gamma) if x.numel() else None


def _per_sample(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` of a vmap rule with its batch dimension first: ``t[i]`` is sample i's (``t`` itself for every
    sample where ``t`` is not batched, ``dim`` None)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


class _RMSNormFunction(torch.autograd.Function):
    """The norm's one route, eager and compiled: ``_forward``, then ``_backward``.

    ``forward`` and ``setup_context`` are separate, as torch.func (``grad``, ``vjp``, ``jacrev``,
    ``vmap``) requires of an autograd.Function. ``plan``: the launch plan, made once by the caller for
    both directions, or None, where each direction plans for the tensors it launches on: torch.func
    passes wrappers without a data pointer, which can be planned for only once its rules unwrap them.
    ``counts``: ``counters.counts_for(x.device)``, None while counting is off.
    """

    @staticmethod
    def forward(x, gamma, eps, activation, mode, plan, counts):
        y = _forward(x, gamma, eps, activation, mode, plan)
        _count(counts, counters.FORWARD)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, gamma, eps, activation, mode, plan, counts = inputs
        ctx.save_for_backward(x, gamma)
        # an attribute, not a saved tensor: every later call writes the counts, which autograd's version
        # check on saved tensors would refuse
        ctx.eps, ctx.activation, ctx.mode, ctx.plan, ctx.counts = eps, activation, mode, plan, counts

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, gamma = ctx.saved_tensors
        if not (_readable(dy) and _readable(x)):
            # Under a torch.func transform (its wrappers have no data), torch.func builds the graph of every
            # backward, and the backward op's autograd (an old-style Function made by torch.library) does
            # not run under it: the same kernels, through a Function that does, and refuses double
            # backward as the op does.
            dx, dgamma = _RMSNormBackward.apply(dy, x, gamma, ctx.eps, ctx.activation, ctx.mode, ctx.counts)
        else:
            dx, dgamma = _backward(dy, x, gamma, ctx.eps, ctx.activation, ctx.mode, ctx.plan)
            _count(ctx.counts, counters.BACKWARD)
        return dx, dgamma, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, x, gamma, eps, activation, mode, plan, counts):
        x_dim, gamma_dim = in_dims[:2]
        if gamma_dim is not None:
            # A weight per sample (an ensemble of models, say): the kernels take one gamma, so one call
            # per sample.
            xs, gammas = _per_sample(x, x_dim, info.batch_size), _per_sample(gamma, gamma_dim, info.batch_size)
            return torch.stack([rmsnorm(xs[i], gammas[i], eps, activation, mode) for i in range(info.batch_size)]), 0
        # One gamma: rows are normalized independently, so the batch dimension is one more leading
        # dimension of x, wherever it lies, unless it is the last, the one normalized.
        if x_dim == x.dim() - 1:
            x, x_dim = x.movedim(x_dim, 0), 0
        return rmsnorm(x, gamma, eps, activation, mode), x_dim  # checks the layout the kernels will read


class _RMSNormEager(torch.autograd.Function):
    """``_RMSNormFunction`` in the old style (``forward`` takes ``ctx``), for plain tensors outside torch.func:
    torch's ``apply`` binds a new-style Function's arguments with ``inspect.signature`` on every call, which
    costs more host time than a small norm's kernels. torch.func needs the new style, and gets it."""

    @staticmethod
    def forward(ctx, x, gamma, eps, activation, mode, plan, counts):
        y = _RMSNormFunction.forward(x, gamma, eps, activation, mode, plan, counts)
        _RMSNormFunction.setup_context(ctx, (x, gamma, eps, activation, mode, plan, counts), y)
        return y

    backward = _RMSNormFunction.backward


class _RMSNormBackward(torch.autograd.Function):
    """(dx, dgamma) from the backward kernels under torch.func (see ``_RMSNormFunction.backward``), counted
    per launch: under ``vmap`` (``jacrev``) the rule below launches once per sample."""

    @staticmethod
    def forward(dy, x, gamma, eps, activation, mode, counts):
        grads = launchers.rmsnorm_backward(dy, x, gamma, eps, activation=activation, mode=mode)
        _count(counts, counters.BACKWARD)
        return grads

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, ddx: Tensor, ddgamma: Tensor):
        _refuse_double_backward(ctx, ddx, ddgamma)

    @staticmethod
    def vmap(info, in_dims, dy, x, gamma, eps, activation, mode, counts):
        size = info.batch_size
        dys, xs, gammas = (_per_sample(t, dim, size) for t, dim in zip((dy, x, gamma), in_dims[:3]))
        # One call per sample: dgamma sums over the rows of one sample, and one launch over the rows of
        # several would sum them together.
        grads = [_RMSNormBackward.apply(dys[i], xs[i], gammas[i], eps, activation, mode, counts) for i in range(size)]
        return (torch.stack([dx for dx, _ in grads]), torch.stack([dgamma for _, dgamma in grads])), (0, 0)


class _AddRMSNormFunction(torch.autograd.Function):
    """The route of the norm with a residual: ``(y, h)``, as the op ``rmsnorm_kernel::add_rmsnorm``
    gives them (see ``_RMSNormFunction``)."""

    @staticmethod
    def forward(x, residual, gamma, eps, activation, mode, residual_in_fp32, counts):
        outputs = _forward(x, gamma, eps, activation, mode, residual=residual, residual_in_fp32=residual_in_fp32)
        _count(counts, counters.FORWARD)
        return outputs

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, residual, gamma, eps, activation, mode, _, counts = inputs
        ctx.save_for_backward(output[1], gamma)  # h, the norm's input
        ctx.eps, ctx.activation, ctx.mode, ctx.counts = eps, activation, mode, counts  # see _RMSNormFunction
        ctx.x_dtype, ctx.residual_dtype = x.dtype, residual.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: see _add_grads

    @staticmethod
    def backward(ctx, dy: Tensor | None, dh: Tensor | None):
        h, gamma = ctx.saved_tensors
        if dy is not None and not (_readable(dy) and _readable(h)):
            raise NotImplementedError(
                "rmsnorm (triton): torch.func transforms of the norm with a residual are not implemented; "
                "accepted: plain autograd with a residual, or torch.func without one"
            )
        grads = _add_grads(ctx, h, gamma, dy, dh)
        if dy is not None:  # only then did the backward kernels run
            _count(ctx.counts, counters.BACKWARD)
        return grads + (None,) * 5

    @staticmethod
    def vmap(info, in_dims, x, residual, gamma, eps, activation, mode, residual_in_fp32, counts):
        size = info.batch_size
        xs, rs = _per_sample(x, in_dims[0], size), _per_sample(residual, in_dims[1], size)
        kwargs = dict(residual_in_fp32=residual_in_fp32)
        if in_dims[2] is not None:  # a weight per sample: one call each, as in _RMSNormFunction.vmap
            gs = _per_sample(gamma, in_dims[2], size)
            outs = [rmsnorm(xs[i], gs[i], eps, activation, mode, residual=rs[i], **kwargs) for i in range(size)]
            return (torch.stack([y for y, _ in outs]), torch.stack([h for _, h in outs])), (0, 0)
        # one weight: the batch dimension is one more leading dimension of the rows
        return rmsnorm(xs, gamma, eps, activation, mode, residual=rs, **kwargs), (0, 0)


class _AddRMSNormEager(torch.autograd.Function):
    """``_AddRMSNormFunction`` in the old style, as ``_RMSNormEager`` is ``_RMSNormFunction``."""

    @staticmethod
    def forward(ctx, x, residual, gamma, eps, activation, mode, residual_in_fp32, counts):
        inputs = (x, residual, gamma, eps, activation, mode, residual_in_fp32, counts)
        outputs = _AddRMSNormFunction.forward(*inputs)
        _AddRMSNormFunction.setup_context(ctx, inputs, outputs)
        return outputs

    backward = _AddRMSNormFunction.backward


def _add_rmsnorm(x, residual, gamma, eps, activation, mode, residual_in_fp32) -> tuple[Tensor, Tensor]:
    """``rmsnorm`` with a residual, after its checks of x, gamma, eps, activation and mode."""
    check_residual(x, residual, residual_in_fp32)
    if any(_is_dtensor(t) for t in (x, residual, gamma)):
        return _rmsnorm_dtensor(x, gamma, eps, activation, mode, residual, residual_in_fp32)
    if x.numel() and not launchers.rows_at_one_stride(x):
        x = x.contiguous()
    if residual.numel() and not launchers.rows_at_one_stride(residual):
        residual = residual.contiguous()
    if not gamma.is_contiguous():
        gamma = gamma.contiguous()
    counts = counters.counts_for(x.device) if x.numel() else None
    args = (x, residual, gamma, eps, activation, mode, residual_in_fp32, counts)
    if not (_readable(x) and _readable(residual)):
        return _AddRMSNormFunction.apply(*args)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, residual, gamma)):
        return _AddRMSNormEager.apply(*args)
    outputs = _forward(x, gamma, eps, activation, mode, residual=residual, residual_in_fp32=residual_in_fp32)
    _count(counts, counters.FORWARD)
    return outputs


def _is_dtensor(t) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _rmsnorm_dtensor(x, gamma, eps, activation, mode, residual=None, residual_in_fp32=False):
    """The norm of a DTensor x whose rows are sharded (sequence or data parallel) or replicated, with a
    replicated gamma and a residual placed as x (``contract.check_dtensor``): each process runs the
    kernels on its own rows (``local_map``), y (and h) keep x's placements, and dgamma, a sum over rows, is
    a partial sum along every mesh dimension that shards the rows, which DTensor reduces when it is used."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import local_map

    check_dtensor(x, gamma, residual)
    mesh = x.device_mesh
    if not isinstance(gamma, DTensor):  # from_local, unlike distribute_tensor, keeps gamma's gradient
        gamma = DTensor.from_local(gamma, mesh, [Replicate()] * mesh.ndim, run_check=False)
    rows, weight = list(x.placements), list(gamma.placements)
    grad_gamma = [Partial() if isinstance(p, Shard) else Replicate() for p in x.placements]
    if residual is None:
        local = local_map(
            lambda a, g: rmsnorm(a, g, eps, activation, mode),
            out_placements=rows,  # one output: a list of placements (a tuple means several)
            in_placements=(rows, weight),
            in_grad_placements=(rows, grad_gamma),
            device_mesh=mesh,
        )
        return local(x, gamma)
    local = local_map(
        lambda a, r, g: rmsnorm(a, g, eps, activation, mode, residual=r, residual_in_fp32=residual_in_fp32),
        out_placements=(rows, rows),
        in_placements=(rows, rows, weight),
        in_grad_placements=(rows, rows, grad_gamma),
        device_mesh=mesh,
    )
    return local(x, residual, gamma)


def rmsnorm(
    x: Tensor,
    gamma: Tensor,
    eps: float = DEFAULT_EPS,
    activation: str | None = None,
    mode: str = "torch",
    residual: Tensor | None = None,
    residual_in_fp32: bool = False,
):
    """RMSNorm over the last dimension through the Triton kernels; differentiable in x and gamma.

    With a ``residual`` of x's shape it returns ``(y, h)``: h = x + residual (in the dtype torch promotes
    the two to, or float32 with ``residual_in_fp32=True``) and y the norm of h as stored, in the dtype
    it would have without a residual (x's, or promoted in ``"llama"`` mode), from the same
    kernels, which read x and the residual once and write h and y; gradients flow to x and the residual
    through both outputs. This is the add and norm of a pre-norm transformer block. Under torch.func,
    ``vmap`` works on this form; ``grad``, ``vjp`` and ``jacrev`` of it are refused with one line.

    ``mode`` picks the numerics of ``reference.py``: ``"torch"`` (``torch.nn.RMSNorm``'s), ``"llama"``
    (``LlamaRMSNorm``'s: the normalized x rounded to x's dtype before the weight, y in the promoted dtype)
    or ``"gemma"`` (``GemmaRMSNorm``'s: the scale is ``1 + gamma``).

    ``activation="silu"`` gives ``silu(rmsnorm(x, gamma, eps))`` from the same kernels, forward and
    backward, without writing or reading the norm's output in between (``reference.py`` has the formulas).

    Raises ``ContractError`` for inputs the kernels cannot handle (see ``contract.py``), before any
    kernel runs. Under ``torch.compile`` it calls the custom op ``torch.ops.rmsnorm_kernel.rmsnorm``
    (one opaque node, no graph break), which checks again for its direct callers; checking here first
    also catches arguments the dispatcher would convert or refuse in its own words (``eps=True``).

    An x with no rows (shape (0, N), (2, 0, N), ...) gives an empty y of x's shape and dtype and, in
    backward, an empty dx and a dgamma of zeros, as ``F.rms_norm`` and the reference do, eager and
    compiled, without launching a kernel (and so without counting the call, see ``call_counts``).
    Rows of zero elements (N = 0) are refused.

    x may have any strides: read in place where its rows sit at one stride with a contiguous last
    dimension (a contiguous tensor, or a slice ``x[..., :N]`` of one), copied once otherwise (``x.t()``,
    q or k after ``view(B, T, H, D).transpose(1, 2)``). A gamma that is not contiguous is copied too.

    Under torch.func, ``grad``, ``vjp`` and ``jacrev`` run the kernels in both directions. ``vmap`` over x
    with one gamma is one launch over the rows of every sample; over a batched gamma, one launch per
    sample (the kernels take one gamma), and so is a backward under ``vmap`` (dgamma is a sum over one
    sample's rows). Forward mode (``jvp``, ``jacfwd``, ``hessian``) is not implemented.

    A DTensor x sharded along leading dimensions (rows: data or sequence parallel) or replicated, with a
    replicated gamma, is normalized shard by shard; y keeps x's placements and dgamma comes back as a
    partial sum that DTensor reduces. x sharded along its last dimension is refused.
    """
    check_forward(x, gamma, eps, activation, mode)
    if residual is not None or residual_in_fp32 is not False:
        return _add_rmsnorm(x, residual, gamma, eps, activation, mode, residual_in_fp32)
    if _is_dtensor(x) or _is_dtensor(gamma):
        return _rmsnorm_dtensor(x, gamma, eps, activation, mode)
    # Any layout: rows that no single stride reaches (x.t(), q after a transpose) are copied once here, so
    # that both directions read the copy, and autograd takes dx back to x's layout.
    if x.numel() and not launchers.rows_at_one_stride(x):
        x = x.contiguous()
    if not gamma.is_contiguous():
        gamma = gamma.contiguous()
    counts = counters.counts_for(x.device) if x.numel() else None
    if not (_readable(x) and _readable(gamma)):
        # torch.func's wrappers (vmap's, grad's) have no data to plan for: the Function's rules unwrap them
        return _RMSNormFunction.apply(x, gamma, eps, activation, mode, None, counts)
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad):
        plan = None if _through_op(x, gamma) else _plan(x, gamma)
        return _RMSNormEager.apply(x, gamma, eps, activation, mode, plan, counts)
    y = _forward(x, gamma, eps, activation, mode)
    _count(counts, counters.FORWARD)
    return y
