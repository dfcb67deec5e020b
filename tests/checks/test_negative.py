"""The ``negative`` command: every contract violation refused before any launch, the tripwire's control,
and the BLOCK-denominator mutant caught; and each of them failing when it should. (The list of violations,
the tripwire and the mutants themselves: tests/testing.)"""

import contextlib

import torch

from rmsnorm_kernel import rmsnorm
from rmsnorm_kernel.checks import campaigns, negative
from rmsnorm_kernel.testing import CONTRACT_VIOLATIONS, Violation

#: Enough for the mutant checks: N = 257 catches it, N = 256 hides it.
MUTANT_SHAPES = [(17, 256), (17, 257)]
#: For the tests about something else: one shape that catches the mutant.
ONE_SHAPE = [(1, 257)]


def test_every_violation_is_refused_before_any_launch_and_the_mutants_are_caught(device):
    results, mutant_cases = negative.negative_checks(mutant_shapes=MUTANT_SHAPES, device=device)
    for r in results:
        assert r.ok, (r.name, r.outcome)
    assert [r.name for r in results if r.kind == "contract"] == [v.name for v in CONTRACT_VIOLATIONS]
    assert [r.name for r in results if r.kind == "control"] == ["valid_input_trips_the_wire"]
    assert [r.name for r in results if r.kind == "mutant"] == [
        "forward with denominator BLOCK",
        "dx with denominator BLOCK",
    ]
    failing = {(c.campaign, c.shape[-1]) for c in mutant_cases if not c.ok}
    assert {("forward", 257), ("dx", 257)} <= failing and not any(n == 256 for _, n in failing)


def test_an_accepted_input_listed_as_a_violation_fails_the_negative_check(device):
    accepted = Violation(
        "valid", "x", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 1e-6), r"anything"
    )
    results, _ = negative.negative_checks(violations=[accepted], mutant_shapes=ONE_SHAPE, device=device)
    (case,) = [r for r in results if r.name == "valid"]
    assert not case.ok and "not refused before a launch" in case.outcome


def test_an_x_without_rows_is_no_violation_but_rows_of_zero_elements_are(device):
    """Listed as a violation, an x without rows fails the negative check: it is accepted, with no launch."""
    no_rows = Violation(
        "x_without_rows", "x", lambda d: (torch.randn(0, 8, device=d), torch.ones(8, device=d), 1e-6), r"anything"
    )
    results, _ = negative.negative_checks(violations=[no_rows], mutant_shapes=ONE_SHAPE, device=device)
    (case,) = [r for r in results if r.name == "x_without_rows"]
    assert not case.ok and case.outcome == "accepted (no error raised)"
    assert "x_rows_of_zero_elements" in [v.name for v in CONTRACT_VIOLATIONS]


def test_a_refusal_with_the_wrong_message_fails(device):
    wrong = Violation(
        "eps_zero", "eps", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 0.0), r"gamma has dtype"
    )
    results, _ = negative.negative_checks(violations=[wrong], mutant_shapes=ONE_SHAPE, device=device)
    assert not results[0].ok and "message does not match" in results[0].outcome


def test_a_refusal_that_names_another_argument_fails(device):
    """eps = 0 is refused, and the message matches the pattern, but it is eps's refusal, not gamma's."""
    wrong = Violation(
        "eps_zero", "gamma", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 0.0), r"eps is 0\.0"
    )
    results, _ = negative.negative_checks(violations=[wrong], mutant_shapes=ONE_SHAPE, device=device)
    assert not results[0].ok and "does not name 'gamma' first" in results[0].outcome


def test_a_mutant_that_is_not_caught_fails_the_negative_check(device, monkeypatch):
    monkeypatch.setitem(campaigns.KERNELS["forward"], "block-mean", rmsnorm)  # the "mutant" is the real kernel
    results, _ = negative.negative_checks(violations=[], mutant_shapes=ONE_SHAPE, device=device)
    (forward,) = [r for r in results if r.name.startswith("forward")]
    assert not forward.ok and "caught in 0 of 3 compared cases" in forward.outcome


def test_a_tripwire_that_sees_nothing_fails_the_control(device, monkeypatch):
    monkeypatch.setattr(negative, "kernel_launches_forbidden", lambda: contextlib.nullcontext([]))
    results, _ = negative.negative_checks(violations=[], mutant_shapes=ONE_SHAPE, device=device)
    (control,) = [r for r in results if r.kind == "control"]
    assert not control.ok and "the tripwire sees nothing" in control.outcome
