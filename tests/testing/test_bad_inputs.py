"""The list of the contract's bad inputs: what each case builds, the argument it blames, and how a refusal
is judged against it. (That the contract refuses each: tests/ops/test_contract.py; that the ``negative``
command does: tests/checks/test_negative.py.)"""

import torch

from rmsnorm_kernel.testing import CONTRACT_VIOLATIONS, Violation

ARGUMENTS = {"x", "gamma", "eps", "activation", "mode", "residual", "residual_in_fp32", "x and gamma"}


def test_cases_have_unique_names_and_blame_an_argument_of_rmsnorm():
    names = [v.name for v in CONTRACT_VIOLATIONS]
    assert len(names) == len(set(names))
    assert {v.argument for v in CONTRACT_VIOLATIONS} == ARGUMENTS


def test_every_case_builds_x_gamma_and_eps(device):
    for v in CONTRACT_VIOLATIONS:
        built = v.build(device)
        assert isinstance(built, tuple) and len(built) == 3, v.name


def test_no_rows_cases_have_an_x_without_rows_and_a_fault_of_each_other_kind(device):
    """An x without rows is checked for everything else: these cases have x.numel() == 0 but N >= 1, and
    between them blame every argument."""
    no_rows = [v for v in CONTRACT_VIOLATIONS if v.name.startswith("no_rows_")]
    for v in no_rows:
        x, _, _ = v.build(device)
        assert x.numel() == 0 and x.shape[-1] >= 1, v.name
    assert {v.argument for v in no_rows} == ARGUMENTS


def test_rows_of_zero_elements_are_listed_with_and_without_rows(device):
    shapes = {
        tuple(v.build(device)[0].shape)
        for v in CONTRACT_VIOLATIONS
        if "of_zero_elements" in v.name and v.argument == "x"
    }
    assert {(4, 0), (0, 0), (0,)} <= shapes


def test_problems_accepts_the_refusal_described_and_names_what_differs():
    v = Violation(
        "eps_zero", "eps", lambda d: (torch.ones(2, 4), torch.ones(4), 0.0), r"eps is 0\.0; accepted: a finite"
    )
    assert v.problems("rmsnorm (triton): eps is 0.0; accepted: a finite number > 0") == []
    (wrong_argument,) = v.problems("rmsnorm (triton): gamma has eps is 0.0; accepted: a finite number > 0")
    assert wrong_argument.startswith("the message does not name 'eps' first")
    (wrong_message,) = v.problems("rmsnorm (triton): eps is -1.0; accepted: a finite number > 0")
    assert wrong_message.startswith("message does not match /eps is 0\\.0; accepted: a finite/")
    assert len(v.problems("rmsnorm (triton): x has dtype torch.float64; accepted: float32")) == 2
