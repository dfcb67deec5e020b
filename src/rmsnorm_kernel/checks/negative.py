"""The ``negative`` command: what must fail does fail.

- Every contract violation of ``rmsnorm_kernel.testing.CONTRACT_VIOLATIONS`` is refused with a
  ``ContractError`` whose message names the argument at fault first, what it received and what is
  accepted, before any kernel launches (the tripwire of ``rmsnorm_kernel.testing.tripwire``), leaving
  x as it was and the op's call counters where they were. (An x with no rows is no violation by
  itself: it gives an empty y without a launch. Rows of zero elements, N = 0, are one.)
- A control: a valid input under the same tripwire does reach a kernel, so "no launch" above means
  refused in time, not a tripwire that sees nothing.
- The BLOCK_N-denominator mutants of ``rmsnorm_kernel.testing.mutants`` are caught by the forward and
  dx campaigns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..ops.backend import kernel_device_type
from ..ops.contract import ContractError
from ..ops.counters import call_counts, counting
from ..ops.op import rmsnorm
from ..testing import CONTRACT_VIOLATIONS, KernelLaunched, Violation, kernel_launches_forbidden, make_inputs
from .campaigns import FULL_SHAPES, CampaignCase, run_campaign
from .report import is_power_of_two, one_line


@dataclass
class NegativeCase:
    """One negative check: what was tried, what had to happen, what happened."""

    kind: str  # "contract", "control" or "mutant"
    name: str
    expected: str
    outcome: str
    ok: bool


def _try_refusal(v: Violation, device: str) -> NegativeCase:
    expected = f"ContractError naming {v.argument}, matching /{v.message}/, no kernel launched, x untouched"
    x, gamma, eps = v.build(device)
    x_before = x.detach().clone() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None
    counts_before = call_counts()
    try:
        with kernel_launches_forbidden():
            rmsnorm(x, gamma, eps, **v.kwargs(device))
    except ContractError as exc:
        problems = v.problems(str(exc))
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
    # Shapes the mutant refuses to run (rows wider than launch.ROW_LIMIT have no mutant) prove nothing either way.
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
        pow2_ns = sorted({c.shape[-1] for c in caught_at_pow2})
        outcome += f"; also failed at a power of two N, which the BLOCK defect cannot explain: {pow2_ns}"
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


@counting()  # a refusal must leave the counts where they were
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
