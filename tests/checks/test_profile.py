"""Profiling each path: the counts are recorded, and the Triton path runs exactly once per phase."""

import pytest
import torch

from rmsnorm_kernel.checks import profile
from rmsnorm_kernel.ops.reference import rmsnorm_reference

PATHS = ("reference", "triton", "torch.compile(reference)")
PHASES = ("forward", "forward+backward")


def test_profile_counts_each_path_and_the_triton_op_once_per_phase(device):
    rows = profile.profile_counts(shape=(4, 33), device=device)
    assert [(r.path, r.phase) for r in rows] == [(p, ph) for p in PATHS for ph in PHASES]
    assert all(r.ok and r.count > 0 and sum(r.names.values()) == r.count for r in rows), [r for r in rows if not r.ok]
    triton = {r.phase: r.triton_calls for r in rows if r.path == "triton"}
    assert triton == {"forward": {"forward": 1, "backward": 0}, "forward+backward": {"forward": 1, "backward": 1}}
    assert all(r.triton_calls == {"forward": 0, "backward": 0} for r in rows if r.path != "triton")
    assert {r.unit for r in rows} == {"GPU kernels" if device == "cuda" else "CPU operator calls"}


def test_profile_fails_when_the_triton_path_is_not_taken(device, monkeypatch):
    monkeypatch.setattr(profile, "rmsnorm", rmsnorm_reference)
    rows = profile.profile_counts(shape=(4, 33), device=device)
    triton_rows = [r for r in rows if r.path == "triton"]
    assert len(triton_rows) == 2 and not any(r.ok for r in triton_rows)
    assert all("Triton op calls" in r.detail for r in triton_rows)
    assert all(r.ok for r in rows if r.path != "triton")


def test_compile_profiled_compiles_without_an_option_this_torch_lacks(monkeypatch):
    with pytest.raises(RuntimeError):  # what compile_profiled relies on: an unknown option is refused at once
        torch.compile(rmsnorm_reference, options={"no_such_option": True})
    monkeypatch.setattr(profile, "KERNEL_PROFILE_OPTIONS", {"no_such_option": True})
    assert callable(profile.compile_profiled(rmsnorm_reference))
