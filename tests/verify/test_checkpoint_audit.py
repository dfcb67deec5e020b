"""The checkpoint audit: good files verified, every bad one named with the stage at which it failed."""

import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.verify import checkpoint_audit

from .helpers import build_network, write_checkpoint


class NotAllowedUnderWeightsOnly:
    pass


@pytest.fixture
def checkpoint_dir(tmp_path, device):
    root = tmp_path / "checkpoints"
    write_checkpoint(root / "triton_seed0" / "version_0" / "last.ckpt", device)
    write_checkpoint(root / "triton_seed0" / "version_0" / "unprefixed.ckpt", device, seed=1, prefix="")
    write_checkpoint(root / "triton_seed1" / "tampered.ckpt", device, tamper=0.01)
    (root / "damaged").mkdir()
    (root / "damaged" / "random.ckpt").write_bytes(b"\x00\x01 not a zip archive " * 10)
    (root / "damaged" / "empty.ckpt").write_bytes(b"")
    good = (root / "triton_seed0" / "version_0" / "last.ckpt").read_bytes()
    (root / "damaged" / "truncated.ckpt").write_bytes(good[: len(good) // 2])
    (root / "foreign").mkdir()
    torch.save({"weights": torch.ones(3)}, root / "foreign" / "other.ckpt")
    torch.save(NotAllowedUnderWeightsOnly(), root / "foreign" / "pickled_object.ckpt")
    (root / "notes.txt").write_text("not a checkpoint")
    return root


def test_audit_verifies_good_files_and_names_each_bad_one(checkpoint_dir, device):
    audits = checkpoint_audit.audit_checkpoints(checkpoint_dir, build_network, device=device)
    results = {Path(r.file).relative_to(checkpoint_dir).as_posix(): r for r in audits}
    assert (results["triton_seed0/version_0/last.ckpt"].stage, results["triton_seed0/version_0/last.ckpt"].ok) == ("verified", True)
    assert results["triton_seed0/version_0/unprefixed.ckpt"].ok
    assert (results["triton_seed1/tampered.ckpt"].stage, results["triton_seed1/tampered.ckpt"].ok) == ("reproduce", False)
    assert results["triton_seed1/tampered.ckpt"].max_abs == pytest.approx(0.01, rel=1e-3)
    for name in ("damaged/random.ckpt", "damaged/empty.ckpt", "damaged/truncated.ckpt", "foreign/pickled_object.ckpt"):
        assert (results[name].stage, results[name].ok) == ("load", False), name
    assert results["foreign/other.ckpt"].stage == "keys" and "missing key(s)" in results["foreign/other.ckpt"].detail
    assert results["notes.txt"].stage == "skipped" and results["notes.txt"].ok


def test_audit_reports_a_missing_model_module_per_file(checkpoint_dir, device, monkeypatch):
    monkeypatch.setitem(sys.modules, "rmsnorm_kernel.training.model", None)  # makes the import fail
    results = [r for r in checkpoint_audit.audit_checkpoints(checkpoint_dir, device=device) if r.file.endswith("last.ckpt")]
    assert len(results) == 1
    assert results[0].stage == "rebuild" and not results[0].ok
    assert "rmsnorm_kernel.training.model.build_network is not importable" in results[0].detail


def test_audit_with_the_projects_build_network(tmp_path, device):
    from rmsnorm_kernel.training.model import build_network as project_build_network

    write_checkpoint(tmp_path / "run" / "a.ckpt", device, builder=project_build_network)
    (result,) = checkpoint_audit.audit_checkpoints(tmp_path, device=device)
    assert result.ok, result.detail


def test_audit_of_a_missing_directory_is_empty(tmp_path):
    assert checkpoint_audit.audit_checkpoints(tmp_path / "nowhere", build_network) == []
