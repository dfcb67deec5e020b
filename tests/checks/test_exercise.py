"""The exercise: a row of ones shows the BLOCK-denominator defect at N = 257 and hides it at N = 256."""

import math

import pytest

from rmsnorm_kernel import rmsnorm
from rmsnorm_kernel.checks import campaigns, exercise

EPS = 1e-6


def by_key(rows, what):
    return {(r.n, r.kernel): r for r in rows if r.what.startswith(what)}


def test_exercise_shows_the_defect_at_257_and_not_at_256(device):
    rows = exercise.exercise(eps=EPS, device=device)
    assert all(r.ok for r in rows)
    fwd = by_key(rows, "forward")
    assert fwd[257, "triton"].value == pytest.approx(1 / math.sqrt(1 + EPS), abs=1e-6)
    assert fwd[257, "block-mean"].value == pytest.approx(1 / math.sqrt(257 / 512 + EPS), abs=1e-6)
    assert fwd[257, "block-mean"].value == pytest.approx(1.411458, abs=1e-6)
    assert fwd[256, "block-mean"].value == fwd[256, "triton"].value
    bwd = by_key(rows, "backward")
    assert not bwd[257, "block-mean"].agrees_with_reference and bwd[256, "block-mean"].agrees_with_reference
    assert bwd[257, "triton"].agrees_with_reference and bwd[256, "triton"].agrees_with_reference


def test_exercise_fails_when_the_broken_forward_is_fixed(device, monkeypatch):
    monkeypatch.setattr(exercise, "forward_block_mean", rmsnorm)
    row = by_key(exercise.exercise(eps=EPS, device=device), "forward")[257, "block-mean"]
    assert not row.ok


def test_exercise_fails_when_the_broken_backward_is_fixed(device, monkeypatch):
    monkeypatch.setattr(exercise, "dx_block_mean", campaigns.triton_dx)
    rows = exercise.exercise(eps=EPS, device=device)
    assert not by_key(rows, "backward")[257, "block-mean"].ok
    assert all(r.ok for r in rows if r.what.startswith("forward"))
