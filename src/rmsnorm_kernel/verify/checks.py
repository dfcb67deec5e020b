"""The verification campaigns behind ``python -m rmsnorm_kernel <command>``, as plain functions.

Each function runs one kind of check and returns records (dataclasses) that say what was tried and
whether it held; ``cli.py`` prints them as tables and writes them as JSON. Tolerances and the
comparison rule come from ``tolerances.compare`` only.

Numeric campaigns compare the Triton path with the oracle of ``reference.py``:

- forward:  ``rmsnorm(x, gamma)`` against ``rmsnorm_reference(x, gamma)``;
- dx, dgamma: autograd through ``rmsnorm`` against autograd through the reference, with the same dy.

The inputs of every case are drawn from a generator seeded by the case's position, so a report can be
reproduced case by case.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from ..ops import kernels
from ..ops.backend import backend, kernel_device_type
from ..ops.contract import MAX_N, ContractError
from .mutants import dx_block_mean, forward_block_mean
from ..ops.op import call_counts, rmsnorm
from ..ops.reference import DEFAULT_EPS, manual_backward, rmsnorm_reference
from ..ops.tolerances import TOLERANCES, compare

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Rows longer than 4096, up to the largest N the contract accepts (kernels may switch strategy there).
_LONG_ROWS = tuple(s for s in ((3, 10000), (1, MAX_N)) if 4096 < s[-1] <= MAX_N)
#: The full campaign: irregular shapes, M of 1 and 17, N of 255/256/257, powers of two and their
#: neighbours, long rows, and inputs of more than two dimensions. At least 28 shapes x 3 dtypes.
FULL_SHAPES: tuple[tuple[int, ...], ...] = (
    (1, 255), (1, 256), (1, 257),
    (17, 255), (17, 256), (17, 257),
    (1, 1), (17, 1), (3, 2), (5, 7), (17, 33), (4, 100),
    (9, 127), (2, 128), (6, 129), (3, 500), (2, 511), (2, 513),
    (1, 768), (4, 1000), (2, 1023), (1, 1025), (1, 2047), (1, 3000),
    (1, 4095), (1, 4096),
    (2, 3, 257), (2, 2, 5, 96),
    *_LONG_ROWS,
)
#: A short campaign for CI: still M of 1 and 17, N on both sides of a power of two.
QUICK_SHAPES: tuple[tuple[int, ...], ...] = ((1, 257), (17, 255), (17, 256), (2, 3, 100))

CAMPAIGNS = ("forward", "dx", "dgamma")

Forward = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: enough for a table cell; some errors carry whole tracebacks."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


# --------------------------------------------------------------------------------------------------
# Numeric campaigns


@dataclass
class CampaignCase:
    """One comparison of the Triton path (or a substitute) with the oracle."""

    campaign: str
    kernel: str
    dtype: str
    shape: tuple[int, ...]
    seed: int
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool
    error: str = ""


def campaign_inputs(shape: Sequence[int], dtype: torch.dtype, device: str, seed: int):
    """x ~ N(0, 1), gamma = 1 + 0.5 * N(0, 1) (never all ones) and dy ~ N(0, 1), from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = torch.randn(tuple(shape), generator=g).to(device=device, dtype=dtype)
    gamma = (1.0 + 0.5 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    dy = torch.randn(tuple(shape), generator=g).to(device=device, dtype=dtype)
    return x, gamma, dy


def _grads(fn: Forward, x: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, eps: float):
    xl = x.detach().clone().requires_grad_()
    gl = gamma.detach().clone().requires_grad_()
    fn(xl, gl, eps).backward(dy)
    return xl.grad, gl.grad


def triton_dx(dy, x, gamma, eps):
    return _grads(rmsnorm, x, gamma, dy, eps)[0]


def triton_dgamma(dy, x, gamma, eps):
    return _grads(rmsnorm, x, gamma, dy, eps)[1]


#: What each campaign can run: the Triton path, and for forward and dx the deliberately broken variant
#: of ``mutants.py`` (denominator BLOCK instead of N), which the campaign must catch.
KERNELS: dict[str, dict[str, Callable]] = {
    "forward": {"triton": rmsnorm, "block-mean": forward_block_mean},
    "dx": {"triton": triton_dx, "block-mean": dx_block_mean},
    "dgamma": {"triton": triton_dgamma},
}


def _expected(campaign: str, x, gamma, dy, eps):
    if campaign == "forward":
        return rmsnorm_reference(x, gamma, eps)
    dx, dgamma = _grads(rmsnorm_reference, x, gamma, dy, eps)
    return dx if campaign == "dx" else dgamma


def run_campaign(
    campaign: str,
    kernel: str = "triton",
    shapes: Iterable[Sequence[int]] = FULL_SHAPES,
    dtypes: Iterable[torch.dtype] = DTYPES,
    eps: float = DEFAULT_EPS,
    device: str | None = None,
) -> list[CampaignCase]:
    """Compare ``kernel`` with the oracle for every (shape, dtype); an exception fails its case only."""
    if campaign not in KERNELS:
        raise ValueError(f"campaign is {campaign!r}; accepted: {', '.join(CAMPAIGNS)}")
    if kernel not in KERNELS[campaign]:
        raise ValueError(f"kernel {kernel!r} has no {campaign} variant; accepted: {', '.join(KERNELS[campaign])}")
    fn = KERNELS[campaign][kernel]
    device = device or kernel_device_type()
    cases = []
    for seed, (shape, dtype) in enumerate((tuple(s), d) for s in shapes for d in dtypes):
        tol = TOLERANCES[dtype]
        x, gamma, dy = campaign_inputs(shape, dtype, device, seed)
        try:
            want = _expected(campaign, x, gamma, dy, eps)
            got = fn(x, gamma, eps) if campaign == "forward" else fn(dy, x, gamma, eps)
            c = compare(got, want)
            case = CampaignCase(campaign, kernel, dtype_name(dtype), shape, seed, c.max_abs, c.max_rel, tol.atol, tol.rtol, c.ok)
        except Exception as exc:  # a crash is a failed case, reported with the others
            case = CampaignCase(campaign, kernel, dtype_name(dtype), shape, seed, math.nan, math.nan, tol.atol, tol.rtol, False, one_line(exc))
        cases.append(case)
    return cases


def worst_per_dtype(cases: Iterable[CampaignCase]) -> dict[str, CampaignCase]:
    """Per dtype, a failing case if there is one, else the case with the largest absolute error."""

    def badness(c: CampaignCase):
        return (not c.ok, c.max_abs if not math.isnan(c.max_abs) else math.inf)

    worst: dict[str, CampaignCase] = {}
    for c in cases:
        if c.dtype not in worst or badness(c) > badness(worst[c.dtype]):
            worst[c.dtype] = c
    return worst


# --------------------------------------------------------------------------------------------------
# Environment and reference


@dataclass
class Fact:
    """One line of the environment report."""

    item: str
    value: str


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_facts() -> list[Fact]:
    import platform
    import shutil
    import subprocess
    import sys

    import triton

    facts = [
        Fact("python", sys.version.split()[0]),
        Fact("platform", platform.platform()),
        Fact("torch", torch.__version__),
        Fact("triton", triton.__version__),
        Fact("lightning", _version("lightning")),
        Fact("hydra-core", _version("hydra-core")),
        Fact("tensorboard", _version("tensorboard")),
        Fact("matplotlib", _version("matplotlib")),
        Fact("torch built with CUDA", str(torch.version.cuda)),
        Fact("CUDA device visible", str(torch.cuda.is_available())),
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts.append(Fact(f"GPU {i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}"))
        driver = "unknown (nvidia-smi not found)"
        if shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=30, check=True,
                )
                driver = out.stdout.strip().splitlines()[0]
            except (subprocess.SubprocessError, OSError, IndexError) as exc:
                driver = f"unknown ({type(exc).__name__})"
        facts.append(Fact("GPU driver", driver))
    else:
        facts.append(Fact("GPU", "none"))
    facts.append(Fact("rmsnorm_kernel backend", backend()))
    facts.append(Fact("kernel tensors live on", kernel_device_type()))
    return facts


def environment_proof(device: str | None = None) -> list[CampaignCase]:
    """One small forward and backward of the Triton path against the oracle: a visible GPU is not a usable one."""
    shape, dtypes = [(17, 257)], (torch.float32,)
    cases = []
    for campaign in CAMPAIGNS:
        cases += run_campaign(campaign, shapes=shape, dtypes=dtypes, device=device)
    return cases


@dataclass
class ReferenceCheck:
    check: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""


REFERENCE_SHAPES = ((1, 1), (3, 7), (2, 3, 5), (4, 257))


def reference_checks(shapes: Iterable[Sequence[int]] = REFERENCE_SHAPES) -> list[ReferenceCheck]:
    """float64 gradcheck of the oracle, and its hand-written backward against autograd in every dtype."""
    results = []
    for i, shape in enumerate(map(tuple, shapes)):
        x, gamma, dy = campaign_inputs(shape, torch.float64, "cpu", seed=1000 + i)
        try:
            ok = torch.autograd.gradcheck(
                lambda a, b: rmsnorm_reference(a, b), (x.requires_grad_(), gamma.requires_grad_()), raise_exception=True
            )
            results.append(ReferenceCheck("gradcheck", "float64", shape, math.nan, math.nan, bool(ok)))
        except Exception as exc:  # gradcheck raises GradcheckError with the mismatching Jacobians
            results.append(ReferenceCheck("gradcheck", "float64", shape, math.nan, math.nan, False, one_line(exc)))
        for dtype in (torch.float64, *DTYPES):
            x, gamma, dy = campaign_inputs(shape, dtype, "cpu", seed=2000 + i)
            dx_auto, dgamma_auto = _grads(rmsnorm_reference, x, gamma, dy, DEFAULT_EPS)
            dx_man, dgamma_man = manual_backward(x, gamma, dy, DEFAULT_EPS)
            for name, got, want in (("manual dx = autograd", dx_man, dx_auto), ("manual dgamma = autograd", dgamma_man, dgamma_auto)):
                c = compare(got, want)
                results.append(ReferenceCheck(name, dtype_name(dtype), shape, c.max_abs, c.max_rel, c.ok))
    return results


# --------------------------------------------------------------------------------------------------
# Negative checks: contract violations and the mutant


@dataclass(frozen=True)
class Violation:
    """An input the Triton path must refuse, and a pattern its ContractError message must match.

    The patterns check that the message names the argument, what it received and what is accepted.
    ``build(device)`` returns ``(x, gamma, eps)`` or raises ``NotApplicable``.
    """

    name: str
    build: Callable[[str], tuple]
    message: str
    requires_grad: bool = False


class NotApplicable(Exception):
    """The violation cannot be constructed on this machine (for example, a limit it cannot reach)."""


def _scratch_over_budget(d: str):
    from ..ops import contract

    n, budget = MAX_N, contract.DGAMMA_SCRATCH_BUDGET_BYTES

    def need(rows: int) -> int:
        return contract.dgamma_scratch_bytes(rows, n, torch.device(d))

    # x is allocated, never filled, so its rows are capped (2 GiB of float32). A scratch that stays
    # under the budget at the cap (the backward keeps one partial row per program, whatever M) means
    # the violation cannot be built on this device.
    cap = max(1, (1 << 31) // (4 * n))
    if need(cap) <= budget:
        raise NotApplicable(f"the dgamma scratch for N = {n} stays at {need(cap) / 2**20:.1f} MiB or less on {d} (budget {budget / 2**20:g} MiB)")
    lo, hi = 1, cap  # the fewest rows over the budget
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if need(mid) <= budget else (lo, mid)
    return torch.empty(lo, n, device=d), torch.ones(n, device=d), 1e-6


def _rows_without_one_stride(d: str):
    x = torch.randn(3, 5, 8, device=d)[:, :4, :]  # strides (40, 8, 1): rows of the two slabs 40 apart, 8 within
    return x, torch.ones(8, device=d), 1e-6


CONTRACT_VIOLATIONS: tuple[Violation, ...] = (
    Violation("x_not_tensor", lambda d: ([[1.0, 2.0]], torch.ones(2, device=d), 1e-6), r"x is a list; accepted: a torch\.Tensor"),
    Violation("gamma_not_tensor", lambda d: (torch.randn(4, 2, device=d), [1.0, 1.0], 1e-6), r"gamma is a list; accepted: a torch\.Tensor"),
    Violation("x_float64", lambda d: (torch.randn(4, 6, device=d, dtype=torch.float64), torch.ones(6, device=d, dtype=torch.float64), 1e-6), r"x has dtype torch\.float64; accepted: float32, float16 or bfloat16"),
    Violation("x_int32", lambda d: (torch.ones(4, 6, device=d, dtype=torch.int32), torch.ones(6, device=d), 1e-6), r"x has dtype torch\.int32; accepted:"),
    Violation("gamma_float64", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float64), 1e-6), r"gamma has dtype torch\.float64; accepted:"),
    Violation("dtypes_differ", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float16), 1e-6), r"x and gamma have dtypes torch\.float32 and torch\.float16; accepted: the same dtype"),
    Violation("half_pair_differs", lambda d: (torch.randn(4, 6, device=d, dtype=torch.float16), torch.ones(6, device=d, dtype=torch.bfloat16), 1e-6), r"have dtypes torch\.float16 and torch\.bfloat16; accepted:"),
    Violation("devices_differ", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device="meta"), 1e-6), r"x and gamma are on .* and meta; accepted: both on the same device"),
    Violation("device_not_served", lambda d: (torch.randn(4, 6, device="meta"), torch.ones(6, device="meta"), 1e-6), r"x is on meta; accepted: (cpu|cuda) tensors"),
    Violation("x_transposed", lambda d: (torch.randn(8, 6, device=d).t(), torch.ones(8, device=d), 1e-6), r"x has a last dimension of stride 6 .*; accepted: a last dimension of stride 1"),
    Violation("x_every_other_column", lambda d: (torch.randn(4, 12, device=d)[:, ::2], torch.ones(6, device=d), 1e-6), r"x has a last dimension of stride 2 .*; accepted: a last dimension of stride 1"),
    Violation("x_rows_at_two_strides", _rows_without_one_stride, r"x has rows that no single row stride reaches .*; accepted: .*rows at one uniform stride"),
    Violation("x_batch_transposed", lambda d: (torch.randn(3, 4, 8, device=d).transpose(0, 1), torch.ones(8, device=d), 1e-6), r"x has rows that no single row stride reaches"),
    Violation("gamma_not_contiguous", lambda d: (torch.randn(4, 6, device=d), torch.ones(12, device=d)[::2], 1e-6), r"gamma is not contiguous.*; accepted: a contiguous tensor"),
    Violation("x_0d", lambda d: (torch.tensor(1.0, device=d), torch.ones(1, device=d), 1e-6), r"x is a 0-d tensor; accepted:"),
    Violation("gamma_wrong_length", lambda d: (torch.randn(4, 6, device=d), torch.ones(7, device=d), 1e-6), r"gamma has shape \(7,\); accepted: shape \(6,\)"),
    Violation("gamma_2d", lambda d: (torch.randn(4, 6, device=d), torch.ones(1, 6, device=d), 1e-6), r"gamma has shape \(1, 6\); accepted:"),
    Violation("x_empty", lambda d: (torch.randn(0, 6, device=d), torch.ones(6, device=d), 1e-6), r"x is empty \(shape \(0, 6\)\); accepted: at least one element"),
    Violation("eps_zero", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), 0.0), r"eps is 0\.0; accepted: a finite number > 0"),
    Violation("eps_negative", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), -1e-6), r"eps is -1e-06; accepted:"),
    Violation("eps_nan", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("nan")), r"eps is nan; accepted:"),
    Violation("eps_inf", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("inf")), r"eps is inf; accepted:"),
    Violation("eps_bool", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), True), r"eps is True; accepted:"),
    Violation("eps_str", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), "1e-6"), r"eps is '1e-6'; accepted:"),
    Violation("n_too_large", lambda d: (torch.randn(2, MAX_N + 1, device=d), torch.ones(MAX_N + 1, device=d), 1e-6), rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}"),
    Violation("dgamma_scratch_over_budget", _scratch_over_budget, r"needs a dgamma scratch of .* MiB in the backward; accepted: .*MiB", requires_grad=True),
)


class KernelLaunched(AssertionError):
    """A Triton kernel of ``kernels.py`` was launched while launches were forbidden."""


class _Tripwire:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):  # a Triton kernel is launched as kernel[grid](...)
        raise KernelLaunched(f"kernels.{self.name} was launched")

    def __call__(self, *args, **kwargs):
        raise KernelLaunched(f"kernels.{self.name} was called")

    def __getattr__(self, attr):  # .run(...), .warmup(...), or anything else reaching for the kernel
        raise KernelLaunched(f"kernels.{self.name}.{attr} was used")


@contextlib.contextmanager
def kernel_launches_forbidden():
    """Replace every Triton kernel of ``kernels.py`` by a tripwire that raises ``KernelLaunched`` when used.

    Only the kernels: the launchers' planning helpers (block sizes, scratch sizes) may be consulted by
    the contract itself, and consulting them writes nothing.
    """
    import triton

    saved = {name: obj for name, obj in vars(kernels).items() if isinstance(obj, triton.runtime.jit.KernelInterface)}
    try:
        for name in saved:
            setattr(kernels, name, _Tripwire(name))
        yield sorted(saved)
    finally:
        for name, obj in saved.items():
            setattr(kernels, name, obj)


@dataclass
class NegativeCase:
    """One negative check: what was tried, what had to happen, what happened."""

    kind: str  # "contract", "control" or "mutant"
    name: str
    expected: str
    outcome: str
    ok: bool


def _try_refusal(v: Violation, device: str) -> NegativeCase:
    expected = f"ContractError matching /{v.message}/, no kernel launched, x untouched"
    try:
        x, gamma, eps = v.build(device)
    except NotApplicable as exc:
        return NegativeCase("contract", v.name, expected, f"not applicable here: {exc}", True)
    if v.requires_grad:
        x.requires_grad_()
    # A copy to compare against, except of an allocated-but-never-filled tensor too large to copy cheaply.
    small = isinstance(x, torch.Tensor) and x.device.type != "meta" and x.numel() <= 1 << 20
    x_before = x.detach().clone() if small else None
    counts_before = call_counts()
    try:
        with kernel_launches_forbidden():
            rmsnorm(x, gamma, eps)
    except ContractError as exc:
        problems = []
        if not re.search(v.message, str(exc)):
            problems.append(f"message does not match: {exc}")
        if call_counts() != counts_before:
            problems.append("the op's call counter moved")
        if x_before is not None and not torch.equal(x.detach(), x_before):
            problems.append("x was modified")
        if problems:
            return NegativeCase("contract", v.name, expected, "; ".join(problems), False)
        return NegativeCase("contract", v.name, expected, f"refused: {exc}", True)
    except KernelLaunched as exc:
        return NegativeCase("contract", v.name, expected, f"not refused before a launch: {exc}", False)
    except Exception as exc:
        return NegativeCase("contract", v.name, expected, f"raised {one_line(exc)} instead", False)
    return NegativeCase("contract", v.name, expected, "accepted (no error raised)", False)


def _control_case(device: str) -> NegativeCase:
    # The refusals above prove "before any launch" only if the tripwire catches a launch at all.
    x, gamma, _ = campaign_inputs((4, 6), torch.float32, device, seed=0)
    expected = "a valid input reaches a kernel and trips the wire (so refusals above happened before any launch)"
    try:
        with kernel_launches_forbidden():
            rmsnorm(x, gamma)
    except KernelLaunched as exc:
        return NegativeCase("control", "valid_input_trips_the_wire", expected, f"tripped: {exc}", True)
    except Exception as exc:
        return NegativeCase("control", "valid_input_trips_the_wire", expected, f"raised {one_line(exc)}", False)
    return NegativeCase("control", "valid_input_trips_the_wire", expected, "ran without touching kernels.py: the tripwire sees nothing", False)


def _mutant_case(campaign: str, shapes, device: str) -> tuple[NegativeCase, list[CampaignCase]]:
    cases = run_campaign(campaign, kernel="block-mean", shapes=shapes, device=device)
    # Shapes the mutant refuses to run (it copies only some of the kernels) prove nothing either way.
    refused = [c for c in cases if c.error]
    compared = [c for c in cases if not c.error]
    caught = [c for c in compared if not c.ok]
    hidden = [c for c in compared if c.ok and not is_power_of_two(c.shape[-1])]
    caught_at_pow2 = [c for c in caught if is_power_of_two(c.shape[-1])]
    outcome = (
        f"caught in {len(caught)} of {len(compared)} compared cases"
        f" (N of the caught cases: {sorted({c.shape[-1] for c in caught})});"
        f" unnoticed where N is a power of two (BLOCK == N)"
        + (f" and in {len(hidden)} other case(s) within tolerance" if hidden else "")
    )
    if refused:
        outcome += f"; not run at N = {sorted({c.shape[-1] for c in refused})} ({refused[0].error})"
    if caught_at_pow2:
        outcome += f"; also failed at a power of two N, which the BLOCK defect cannot explain: {sorted({c.shape[-1] for c in caught_at_pow2})}"
    return (
        NegativeCase("mutant", f"{campaign} with denominator BLOCK", "the campaign fails (at least one case)", outcome, bool(caught)),
        cases,
    )


def negative_checks(
    violations: Iterable[Violation] | None = None,
    mutant_shapes: Iterable[Sequence[int]] = FULL_SHAPES,
    device: str | None = None,
) -> tuple[list[NegativeCase], list[CampaignCase]]:
    """Every violation (default ``CONTRACT_VIOLATIONS``) refused before a launch, a control that the
    tripwire works, and the mutant caught. Returns the negative cases and the mutant campaigns' cases.
    """
    device = device or kernel_device_type()
    results = [_try_refusal(v, device) for v in (CONTRACT_VIOLATIONS if violations is None else violations)]
    results.append(_control_case(device))
    mutant_cases: list[CampaignCase] = []
    for campaign in ("forward", "dx"):
        case, cases = _mutant_case(campaign, list(mutant_shapes), device)
        results.append(case)
        mutant_cases += cases
    return results, mutant_cases


# --------------------------------------------------------------------------------------------------
# The tutorial's exercise


@dataclass
class ExerciseRow:
    what: str
    n: int
    kernel: str
    value: float  # first coordinate of the output (forward) or max |dx - dx_ref| (backward)
    predicted: float  # the value worked out by hand (forward) or NaN (backward)
    max_abs_vs_reference: float
    agrees_with_reference: bool
    should_agree: bool
    ok: bool


def exercise(eps: float = DEFAULT_EPS, device: str | None = None) -> list[ExerciseRow]:
    """A row of ones through the correct and the BLOCK-denominator kernels at N = 257 and N = 256.

    By hand: the correct kernel gives 1 / sqrt(1 + eps) per coordinate; the broken one divides the sum
    of squares N by BLOCK = next_power_of_2(N), giving 1 / sqrt(N / BLOCK + eps): 1.411458 at N = 257,
    the same as the correct value at N = 256. The backward rows use a random dy so that dx is not ~0.
    """
    device = device or kernel_device_type()
    rows = []
    for n in (257, 256):
        block = 1 << (n - 1).bit_length()
        x = torch.ones(1, n, device=device)
        gamma = torch.ones(n, device=device)
        ref = rmsnorm_reference(x, gamma, eps)
        for kernel, fn, predicted in (
            ("triton", rmsnorm, 1 / math.sqrt(1 + eps)),
            ("block-mean", forward_block_mean, 1 / math.sqrt(n / block + eps)),
        ):
            y = fn(x, gamma, eps)
            by_hand = compare(y, torch.full_like(y, predicted)).ok
            c = compare(y, ref)
            should_agree = kernel == "triton" or n == block
            rows.append(ExerciseRow("forward, row of ones", n, kernel, float(y.flatten()[0]), predicted, c.max_abs, c.ok, should_agree, by_hand and c.ok == should_agree))
        _, _, dy = campaign_inputs((1, n), torch.float32, device, seed=n)
        dx_ref, _ = _grads(rmsnorm_reference, x, gamma, dy, eps)
        for kernel, fn in (("triton", triton_dx), ("block-mean", dx_block_mean)):
            c = compare(fn(dy, x, gamma, eps), dx_ref)
            should_agree = kernel == "triton" or n == block
            rows.append(ExerciseRow("backward dx, row of ones, random dy", n, kernel, c.max_abs, math.nan, c.max_abs, c.ok, should_agree, c.ok == should_agree))
    return rows


# --------------------------------------------------------------------------------------------------
# Kernel counts


@dataclass
class ProfileRow:
    path: str
    phase: str
    count: int
    unit: str
    triton_calls: dict[str, int]
    names: dict[str, int] = field(default_factory=dict)
    ok: bool = True
    detail: str = ""


#: Inductor's C++ kernels are visible to the profiler only when compiled with kernel profiling on.
_CPU_KERNEL_MARKERS = ("cpp_fused", "kernel_cpp")


def _count_events(prof, on_gpu: bool) -> tuple[int, dict[str, int]]:
    from torch.autograd import DeviceType

    names: dict[str, int] = {}
    for evt in prof.events():
        if on_gpu:
            keep = evt.device_type == DeviceType.CUDA and not evt.name.startswith(("Memcpy", "Memset"))
        else:
            keep = evt.device_type == DeviceType.CPU and (
                evt.name.startswith(("aten::", "rmsnorm_kernel::")) or any(m in evt.name for m in _CPU_KERNEL_MARKERS)
            )
        if keep:
            names[evt.name] = names.get(evt.name, 0) + 1
    return sum(names.values()), names


def profile_counts(shape: Sequence[int] = (64, 257), device: str | None = None) -> list[ProfileRow]:
    """Kernels (GPU) or operator calls (CPU) of one forward and one forward+backward of each path.

    On the GPU every CUDA kernel the profiler sees is counted (copies and memsets aside). On the CPU
    there are no kernel launches to count; the stand-in is every aten operator call, nested ones
    included, plus Inductor's C++ kernels and the custom op's own entry. Under Triton's interpreter
    the Triton path's count is mostly the interpreter's own tensor bookkeeping.
    Each path runs once unprofiled first, so compilation and autotuning are not counted.
    """
    from torch._inductor import config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    device = device or kernel_device_type()
    on_gpu = device == "cuda"
    unit = "GPU kernels" if on_gpu else "CPU operator calls"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    x, gamma, dy = campaign_inputs(tuple(shape), torch.float32, device, seed=0)
    torch._dynamo.reset()
    paths = {
        "reference": rmsnorm_reference,
        "triton": rmsnorm,
        "torch.compile(reference)": torch.compile(rmsnorm_reference, fullgraph=True),
    }

    def forward(fn, leaves):
        with torch.no_grad():
            fn(*leaves, DEFAULT_EPS)

    def forward_backward(fn, leaves):
        fn(*leaves, DEFAULT_EPS).backward(dy)

    def leaves_for(phase):  # made outside the profiled region, so that their copies are not counted
        if phase == "forward":
            return x, gamma
        return x.clone().requires_grad_(), gamma.clone().requires_grad_()

    kernel_profile = {"cpp.enable_kernel_profile": True} if hasattr(inductor_config.cpp, "enable_kernel_profile") else {}
    rows = []
    with inductor_config.patch(kernel_profile):
        for path, fn in paths.items():
            for phase, step in (("forward", forward), ("forward+backward", forward_backward)):
                step(fn, leaves_for(phase))  # warm-up: compilation, autotuning, lazy initialisation
                leaves = leaves_for(phase)
                if on_gpu:
                    torch.cuda.synchronize()
                before = call_counts()
                with profile(activities=activities) as prof:
                    step(fn, leaves)
                    if on_gpu:
                        torch.cuda.synchronize()
                after = call_counts()
                calls = {k: after[k] - before[k] for k in after}
                count, names = _count_events(prof, on_gpu)
                problems = []
                if count == 0:
                    problems.append(f"the profiler recorded no {unit}")
                if path == "triton":
                    want = {"forward": 1, "backward": 1 if phase == "forward+backward" else 0}
                    if calls != want:
                        problems.append(f"Triton op calls {calls}, expected {want}")
                elif any(calls.values()):
                    problems.append(f"the {path} path called the Triton op: {calls}")
                rows.append(ProfileRow(path, phase, count, unit, calls, names, not problems, "; ".join(problems)))
    return rows


# --------------------------------------------------------------------------------------------------
# torch.compile report


@dataclass
class CompileReport:
    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    code_files: list[str]
    op_calls: list[str]  # the generated lines that call the custom ops
    excerpts: list[str]
    max_abs_output: float
    outputs_match: bool
    grads_match: bool
    triton_calls: dict[str, int]
    ok: bool
    problems: list[str]


class SmallNet(torch.nn.Module):
    """Linear -> RMSNorm (Triton path) -> SiLU -> Linear, with a hidden width that is not a power of two."""

    def __init__(self, d_in: int = 16, hidden: int = 257, d_out: int = 4):
        super().__init__()
        from ..ops.module import RMSNorm

        self.inp = torch.nn.Linear(d_in, hidden)
        self.norm = RMSNorm(hidden, impl="triton")
        self.out = torch.nn.Linear(hidden, d_out)
        with torch.no_grad():  # a gamma that is not all ones, so that dgamma matters
            self.norm.weight.copy_(1.0 + 0.1 * torch.arange(hidden) / hidden)

    def forward(self, x):
        return self.out(torch.nn.functional.silu(self.norm(self.inp(x))))


#: A call of the custom op from Inductor's wrapper code: an extern call, outside any generated kernel.
OP_CALL = re.compile(r"torch\.ops\.rmsnorm_kernel\.(rmsnorm|rmsnorm_backward)\.default\(")


def _excerpts(code: str, context: int = 3) -> tuple[list[str], list[str]]:
    """The lines that call the custom ops, and each with ``context`` lines around it (``>>`` marks the call)."""
    lines = code.splitlines()
    hits = [i for i, line in enumerate(lines) if OP_CALL.search(line)]
    excerpts = []
    for i in hits:
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        excerpts.append("\n".join(f"{'>>' if j == i else '  '} {lines[j]}" for j in range(lo, hi)))
    return [lines[i].strip() for i in hits], excerpts


def compile_report(code_dir: Path, batch: int = 8, device: str | None = None) -> CompileReport:
    """Compile ``SmallNet`` with ``fullgraph=True``, save Inductor's code to ``code_dir``, locate the custom op.

    Checks: no graph break, the custom ops appear in the generated code as calls (extern, not fused into
    an Inductor kernel), and the compiled forward and gradients match eager execution.
    """
    from torch._inductor.utils import run_and_get_code

    device = device or kernel_device_type()
    torch.manual_seed(0)
    net = SmallNet().to(device)
    x = torch.randn(batch, 16, device=device)

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(x)
    reasons = [str(getattr(b, "reason", b)) for b in explanation.break_reasons]

    eager = net(x)
    eager.sum().backward()
    eager_grads = [p.grad.detach().clone() for p in net.parameters()]
    net.zero_grad()

    compiled = torch.compile(net, fullgraph=True)

    def step(inp):
        out = compiled(inp)
        out.sum().backward()
        return out.detach()

    if explanation.graph_break_count:  # fullgraph=True would raise; report the breaks instead
        problems = [f"{explanation.graph_break_count} graph break(s): {reasons}"]
        return CompileReport(explanation.graph_count, explanation.graph_break_count, reasons, [], [], [], math.nan,
                             False, False, {"forward": 0, "backward": 0}, False, problems)
    before = call_counts()
    out, codes = run_and_get_code(step, x)  # resets dynamo first, so this compiles afresh
    after = call_counts()
    calls_made = {k: after[k] - before[k] for k in after}

    code_dir.mkdir(parents=True, exist_ok=True)
    files, op_calls, excerpts = [], [], []
    for i, code in enumerate(codes):
        path = code_dir / f"inductor_output_{i}.py"
        path.write_text(code)
        files.append(str(path))
        calls, ex = _excerpts(code)
        op_calls += calls
        excerpts += [f"{path.name}:\n{e}" for e in ex]

    c = compare(out, eager.detach())
    grads_ok = all(compare(p.grad, g).ok for p, g in zip(net.parameters(), eager_grads))
    problems = []
    if not codes:
        problems.append("Inductor produced no code to inspect")
    for op in ("rmsnorm", "rmsnorm_backward"):
        if not any(f"rmsnorm_kernel.{op}.default(" in line for line in op_calls):
            problems.append(f"torch.ops.rmsnorm_kernel.{op} is not called in the generated code (inlined, fused or missing)")
    if calls_made != {"forward": 1, "backward": 1}:
        problems.append(f"the compiled step called the Triton op {calls_made}, expected one forward and one backward")
    if not c.ok:
        problems.append(f"compiled output differs from eager (max abs {c.max_abs:.3g})")
    if not grads_ok:
        problems.append("compiled gradients differ from eager")
    return CompileReport(
        explanation.graph_count, explanation.graph_break_count, reasons, files, op_calls, excerpts,
        c.max_abs, c.ok, grads_ok, calls_made, not problems, problems,
    )


# --------------------------------------------------------------------------------------------------
# Checkpoint audit
#
# The training writes Lightning ``.ckpt`` files under ``checkpoints/<run>/``. Each holds, besides
# Lightning's own keys, ``rmsnorm_kernel = {"test_inputs": Tensor, "test_outputs": Tensor}``: a batch of
# the test split and the network's outputs on it, recorded when the file was written. The network is
# rebuilt with ``rmsnorm_kernel.model.build_network(**hyper_parameters)``.

CHECKPOINT_SUFFIX = ".ckpt"
CHECKPOINT_KEYS = ("state_dict", "hyper_parameters", "rmsnorm_kernel")
RECORD_KEYS = ("test_inputs", "test_outputs")


@dataclass
class CheckpointAudit:
    """The verdict on one file under ``checkpoints/``; ``stage`` is the last step reached."""

    file: str
    stage: str  # "skipped", "load", "keys", "rebuild", "reproduce" or "verified"
    ok: bool
    detail: str
    max_abs: float = math.nan
    max_rel: float = math.nan


def _import_build_network() -> tuple[Callable | None, str]:
    try:
        from ..training.model import build_network
    except Exception as exc:  # ImportError, or the module failing while it loads
        return None, f"rmsnorm_kernel.model.build_network is not importable ({type(exc).__name__}: {exc})"
    return build_network, ""


def _accepted_kwargs(fn: Callable, hparams: dict) -> dict:
    """The hyper-parameters ``fn`` takes: a LightningModule also saves its own (the learning rate...)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(hparams)
    names = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in hparams.items() if k in names}


def _match_state_dict(saved: dict, expected_keys: set[str]) -> dict | None:
    """``saved`` with the prefix stripped under which Lightning stored the network (``net.``, ``model.``...)."""
    prefixes = {""}
    for key in saved:
        parts = key.split(".")
        prefixes.update(".".join(parts[:i]) + "." for i in range(1, len(parts)))
    for prefix in sorted(prefixes, key=len):
        stripped = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
        if set(stripped) == expected_keys:
            return stripped
    return None


def audit_checkpoint(path: Path, build_network: Callable | None, import_problem: str = "", device: str | None = None) -> CheckpointAudit:
    """Open, check keys, rebuild, and reproduce the recorded test outputs; never raises."""
    from ..training.checkpoints import CheckpointError, read_checkpoint  # needs Lightning (the "train" extra)

    name = str(path)
    try:
        ckpt = read_checkpoint(path, required=())  # weights_only=True, after a CRC check of every record
    except CheckpointError as exc:
        return CheckpointAudit(name, "load", False, one_line(exc))
    except Exception as exc:
        return CheckpointAudit(name, "load", False, f"damaged or not loadable with weights_only=True ({one_line(exc)})")
    if not isinstance(ckpt, dict):
        return CheckpointAudit(name, "keys", False, f"holds a {type(ckpt).__name__}; accepted: a Lightning checkpoint dict")
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    if missing:
        return CheckpointAudit(name, "keys", False, f"missing key(s) {missing}; expected {list(CHECKPOINT_KEYS)} (foreign or older file?)")
    record, hparams, state = ckpt["rmsnorm_kernel"], ckpt["hyper_parameters"], ckpt["state_dict"]
    if not isinstance(record, dict) or not all(isinstance(record.get(k), torch.Tensor) for k in RECORD_KEYS):
        return CheckpointAudit(name, "keys", False, f"rmsnorm_kernel entry is not a dict with tensors {list(RECORD_KEYS)}")
    if not isinstance(hparams, dict) or not isinstance(state, dict):
        return CheckpointAudit(name, "keys", False, "hyper_parameters and state_dict must both be dicts")
    if build_network is None:
        return CheckpointAudit(name, "rebuild", False, f"cannot rebuild the network: {import_problem}")
    device = device or kernel_device_type()
    try:
        net = build_network(**_accepted_kwargs(build_network, hparams))
        expected_keys = set(net.state_dict())
        matched = _match_state_dict(state, expected_keys)
        if matched is None:
            return CheckpointAudit(name, "rebuild", False, f"state_dict keys do not fit build_network(**hyper_parameters): network expects {sorted(expected_keys)[:4]}..., file has {sorted(state)[:4]}...")
        net.load_state_dict(matched)
    except Exception as exc:
        return CheckpointAudit(name, "rebuild", False, f"build_network(**hyper_parameters) failed ({one_line(exc)})")
    try:
        net = net.to(device).eval()
        with torch.no_grad():
            got = net(record["test_inputs"].to(device))
        c = compare(got, record["test_outputs"])
    except Exception as exc:
        return CheckpointAudit(name, "reproduce", False, f"running the network on the recorded test inputs failed ({one_line(exc)})")
    if not c.ok:
        return CheckpointAudit(name, "reproduce", False, f"outputs differ from those recorded at save time beyond {c.tolerance}", c.max_abs, c.max_rel)
    return CheckpointAudit(name, "verified", True, f"reproduces {tuple(record['test_outputs'].shape)} recorded test outputs", c.max_abs, c.max_rel)


def audit_checkpoints(root: Path, build_network: Callable | None = None, device: str | None = None) -> list[CheckpointAudit]:
    """Audit every ``*.ckpt`` under ``root``; other files are listed as skipped. ``build_network`` defaults to the model's."""
    root = Path(root)
    import_problem = ""
    if build_network is None:
        build_network, import_problem = _import_build_network()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    results = []
    for path in files:
        if path.suffix != CHECKPOINT_SUFFIX:
            results.append(CheckpointAudit(str(path), "skipped", True, f"not a {CHECKPOINT_SUFFIX} file"))
        else:
            results.append(audit_checkpoint(path, build_network, import_problem, device))
    return results
