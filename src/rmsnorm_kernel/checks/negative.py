"""The ``negative`` command: what must fail does fail.

- Every contract violation of ``CONTRACT_VIOLATIONS`` is refused with a ``ContractError`` whose message
  names the argument, what it received and what is accepted, before any kernel launches, leaving x as
  it was and the op's call counters where they were. (An x with no rows is not a violation: it gives
  an empty y without a launch. Rows of zero elements, N = 0, are one.)
- A control: a valid input under the same tripwire does reach a kernel, so "no launch" above means
  refused in time, not a tripwire that sees nothing.
- The BLOCK_N-denominator mutants of ``mutants.py`` are caught by the forward and dx campaigns.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from ..ops import kernels
from ..ops.backend import kernel_device_type
from ..ops.contract import MAX_N, ContractError
from ..ops.op import call_counts, rmsnorm
from ..testing import make_inputs
from .campaigns import FULL_SHAPES, CampaignCase, run_campaign
from .report import is_power_of_two, one_line


@dataclass(frozen=True)
class Violation:
    """An input the Triton path must refuse, and a pattern its ContractError message must match.

    ``build(device)`` returns ``(x, gamma, eps)``.
    """

    name: str
    build: Callable[[str], tuple]
    message: str


def _rows_without_one_stride(d: str):
    x = torch.randn(3, 5, 8, device=d)[:, :4, :]  # strides (40, 8, 1): rows of the two slabs 40 apart, 8 within
    return x, torch.ones(8, device=d), 1e-6


CONTRACT_VIOLATIONS: tuple[Violation, ...] = (
    Violation(
        "x_not_tensor",
        lambda d: ([[1.0, 2.0]], torch.ones(2, device=d), 1e-6),
        r"x is a list; accepted: a torch\.Tensor",
    ),
    Violation(
        "gamma_not_tensor",
        lambda d: (torch.randn(4, 2, device=d), [1.0, 1.0], 1e-6),
        r"gamma is a list; accepted: a torch\.Tensor",
    ),
    Violation(
        "x_float64",
        lambda d: (
            torch.randn(4, 6, device=d, dtype=torch.float64),
            torch.ones(6, device=d, dtype=torch.float64),
            1e-6,
        ),
        r"x has dtype torch\.float64; accepted: float32, float16 or bfloat16",
    ),
    Violation(
        "x_int32",
        lambda d: (torch.ones(4, 6, device=d, dtype=torch.int32), torch.ones(6, device=d), 1e-6),
        r"x has dtype torch\.int32; accepted:",
    ),
    Violation(
        "gamma_float64",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float64), 1e-6),
        r"gamma has dtype torch\.float64; accepted:",
    ),
    Violation(
        "dtypes_differ",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d, dtype=torch.float16), 1e-6),
        r"x and gamma have dtypes torch\.float32 and torch\.float16; accepted: the same dtype",
    ),
    Violation(
        "half_pair_differs",
        lambda d: (
            torch.randn(4, 6, device=d, dtype=torch.float16),
            torch.ones(6, device=d, dtype=torch.bfloat16),
            1e-6,
        ),
        r"have dtypes torch\.float16 and torch\.bfloat16; accepted:",
    ),
    Violation(
        "devices_differ",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device="meta"), 1e-6),
        r"x and gamma are on .* and meta; accepted: both on the same device",
    ),
    Violation(
        "device_not_served",
        lambda d: (torch.randn(4, 6, device="meta"), torch.ones(6, device="meta"), 1e-6),
        r"x is on meta; accepted: (cpu|cuda) tensors",
    ),
    Violation(
        "x_transposed",
        lambda d: (torch.randn(8, 6, device=d).t(), torch.ones(8, device=d), 1e-6),
        r"x has a last dimension of stride 6 .*; accepted: a last dimension of stride 1",
    ),
    Violation(
        "x_every_other_column",
        lambda d: (torch.randn(4, 12, device=d)[:, ::2], torch.ones(6, device=d), 1e-6),
        r"x has a last dimension of stride 2 .*; accepted: a last dimension of stride 1",
    ),
    Violation(
        "x_rows_at_two_strides",
        _rows_without_one_stride,
        r"x has rows that no single row stride reaches .*; accepted: .*rows at one uniform stride",
    ),
    Violation(
        "x_batch_transposed",
        lambda d: (torch.randn(3, 4, 8, device=d).transpose(0, 1), torch.ones(8, device=d), 1e-6),
        r"x has rows that no single row stride reaches",
    ),
    Violation(
        "gamma_not_contiguous",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(12, device=d)[::2], 1e-6),
        r"gamma is not contiguous.*; accepted: a contiguous tensor",
    ),
    Violation(
        "x_0d", lambda d: (torch.tensor(1.0, device=d), torch.ones(1, device=d), 1e-6), r"x is a 0-d tensor; accepted:"
    ),
    Violation(
        "x_rows_of_zero_elements",
        lambda d: (torch.randn(4, 0, device=d), torch.ones(0, device=d), 1e-6),
        rf"x has rows of N = 0 elements \(shape \(4, 0\)\); accepted: 1 <= N <= {MAX_N}",
    ),
    Violation(
        "gamma_wrong_length",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(7, device=d), 1e-6),
        r"gamma has shape \(7,\); accepted: shape \(6,\)",
    ),
    Violation(
        "gamma_2d",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(1, 6, device=d), 1e-6),
        r"gamma has shape \(1, 6\); accepted:",
    ),
    Violation(
        "eps_zero",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), 0.0),
        r"eps is 0\.0; accepted: a finite number > 0",
    ),
    Violation(
        "eps_negative",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), -1e-6),
        r"eps is -1e-06; accepted:",
    ),
    Violation(
        "eps_nan",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("nan")),
        r"eps is nan; accepted:",
    ),
    Violation(
        "eps_inf",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), float("inf")),
        r"eps is inf; accepted:",
    ),
    Violation(
        "eps_bool", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), True), r"eps is True; accepted:"
    ),
    Violation(
        "eps_str", lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device=d), "1e-6"), r"eps is '1e-6'; accepted:"
    ),
    Violation(
        "n_too_large",
        lambda d: (torch.randn(2, MAX_N + 1, device=d), torch.ones(MAX_N + 1, device=d), 1e-6),
        rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
    ),
)


# --------------------------------------------------------------------------------------------------
# The tripwire


class KernelLaunched(AssertionError):
    """A Triton kernel of ``ops/kernels.py`` was launched while launches were forbidden."""


class _Tripwire:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):  # a Triton kernel is launched as kernel[grid](...)
        raise KernelLaunched(f"kernels.{self.name} was launched")

    def __call__(self, *args, **kwargs):
        raise KernelLaunched(f"kernels.{self.name} was called")

    def __getattr__(self, attr):  # .run(...), .warmup(...), or anything else reaching for the kernel
        raise KernelLaunched(f"kernels.{self.name}.{attr} was used")


def triton_kernels() -> dict[str, object]:
    """The Triton kernels of ``ops/kernels.py`` by name: every ``triton.jit`` object of the module
    (compiled, or interpreted where there is no GPU)."""
    import triton

    return {name: obj for name, obj in vars(kernels).items() if isinstance(obj, triton.KernelInterface)}


@contextlib.contextmanager
def kernel_launches_forbidden():
    """Replace every Triton kernel of ``ops/kernels.py`` by a tripwire that raises ``KernelLaunched``
    when used; yields the names replaced. The launchers look their kernels up in the module when they
    run, so they meet the tripwires; the planning helpers stay, since the contract may consult them."""
    saved = triton_kernels()
    try:
        for name in saved:
            setattr(kernels, name, _Tripwire(name))
        yield sorted(saved)
    finally:
        for name, obj in saved.items():
            setattr(kernels, name, obj)


# --------------------------------------------------------------------------------------------------
# The checks


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
    x, gamma, eps = v.build(device)
    x_before = x.detach().clone() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None
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
    x, gamma, _ = make_inputs((4, 6), torch.float32, device)
    name = "valid_input_trips_the_wire"
    expected = "a valid input reaches a kernel and trips the wire (so refusals above happened before any launch)"
    try:
        with kernel_launches_forbidden():
            rmsnorm(x, gamma)
    except KernelLaunched as exc:
        return NegativeCase("control", name, expected, f"tripped: {exc}", True)
    except Exception as exc:
        return NegativeCase("control", name, expected, f"raised {one_line(exc)}", False)
    return NegativeCase(
        "control", name, expected, "ran without touching ops/kernels.py: the tripwire sees nothing", False
    )


def _mutant_case(campaign: str, shapes, device: str) -> tuple[NegativeCase, list[CampaignCase]]:
    cases = run_campaign(campaign, kernel="block-mean", shapes=shapes, device=device)
    # Shapes the mutant refuses to run (looped rows have no mutant) prove nothing either way.
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
        NegativeCase(
            "mutant",
            f"{campaign} with denominator BLOCK",
            "the campaign fails (at least one case)",
            outcome,
            bool(caught),
        ),
        cases,
    )


def negative_checks(
    violations: Iterable[Violation] | None = None,
    mutant_shapes: Iterable[Sequence[int]] = FULL_SHAPES,
    device: str | None = None,
) -> tuple[list[NegativeCase], list[CampaignCase]]:
    """Every violation (default ``CONTRACT_VIOLATIONS``) refused before a launch, the control, and the
    mutants caught. Returns the negative cases and the mutant campaigns' cases."""
    device = device or kernel_device_type()
    results = [_try_refusal(v, device) for v in (CONTRACT_VIOLATIONS if violations is None else violations)]
    results.append(_control_case(device))
    mutant_cases: list[CampaignCase] = []
    for campaign in ("forward", "dx"):
        case, cases = _mutant_case(campaign, list(mutant_shapes), device)
        results.append(case)
        mutant_cases += cases
    return results, mutant_cases
