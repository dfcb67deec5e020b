"""The checkpoint audit: good files verified, every bad one named with the stage at which it failed."""

import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel.checks import checkpoint_audit
from rmsnorm_kernel.training.network import build_network

from .helpers import write_checkpoint


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
    assert (results["triton_seed0/version_0/last.ckpt"].stage, results["triton_seed0/version_0/last.ckpt"].ok) == (
        "verified",
        True,
    )
    assert results["triton_seed0/version_0/unprefixed.ckpt"].ok
    assert (results["triton_seed1/tampered.ckpt"].stage, results["triton_seed1/tampered.ckpt"].ok) == (
        "reproduce",
        False,
    )
    assert results["triton_seed1/tampered.ckpt"].max_abs == pytest.approx(0.01, rel=1e-3)
    for name in ("damaged/random.ckpt", "damaged/empty.ckpt", "damaged/truncated.ckpt", "foreign/pickled_object.ckpt"):
        assert (results[name].stage, results[name].ok) == ("load", False), name
    assert results["foreign/other.ckpt"].stage == "keys" and "missing key(s)" in results["foreign/other.ckpt"].detail
    assert results["notes.txt"].stage == "skipped" and results["notes.txt"].ok


def test_audit_reports_a_missing_network_module_per_file(checkpoint_dir, device, monkeypatch):
    monkeypatch.setitem(sys.modules, "rmsnorm_kernel.training.network", None)  # makes the import fail
    results = [
        r for r in checkpoint_audit.audit_checkpoints(checkpoint_dir, device=device) if r.file.endswith("last.ckpt")
    ]
    assert len(results) == 1
    assert results[0].stage == "rebuild" and not results[0].ok
    assert "rmsnorm_kernel.training.network.build_network is not importable" in results[0].detail


def test_audit_rebuilds_with_the_demo_network_when_given_no_builder(tmp_path, device):
    write_checkpoint(tmp_path / "run" / "a.ckpt", device)
    (result,) = checkpoint_audit.audit_checkpoints(tmp_path, device=device)
    assert (result.stage, result.ok) == ("verified", True), result.detail


def test_audit_of_a_missing_directory_is_empty(tmp_path):
    assert checkpoint_audit.audit_checkpoints(tmp_path / "nowhere", build_network) == []


def _with_state(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint ``src`` at ``dst`` with ``edit(ckpt)`` applied."""
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, dst)
    return dst


def test_a_failing_line_says_why(tmp_path, device):
    good = write_checkpoint(tmp_path / "good" / "last.ckpt", device)

    def nan_weight(ckpt):
        ckpt["state_dict"]["net.norm.weight"][3] = float("nan")

    def inf_record(ckpt):
        ckpt["rmsnorm_kernel"]["test_outputs"][0, 1] = float("inf")

    _with_state(good, tmp_path / "bad" / "nan_weight.ckpt", nan_weight)
    _with_state(good, tmp_path / "bad" / "inf_record.ckpt", inf_record)
    write_checkpoint(tmp_path / "bad" / "tampered.ckpt", device, tamper=0.01)
    results = {
        Path(r.file).name: r for r in checkpoint_audit.audit_checkpoints(tmp_path / "bad", build_network, device=device)
    }

    nan = results["nan_weight.ckpt"]
    assert (nan.stage, nan.ok) == ("weights", False)
    assert nan.detail == "not finite: net.norm.weight (1 NaN, 0 inf of 33 values)"
    assert torch.isnan(torch.tensor(nan.max_abs))  # no difference was measured: the table shows '-', not 0
    inf = results["inf_record.ckpt"]
    assert (inf.stage, inf.ok) == ("weights", False)
    assert inf.detail == "not finite: rmsnorm_kernel.test_outputs (0 NaN, 1 inf of 10 values)"
    tampered = results["tampered.ckpt"]
    assert (tampered.stage, tampered.ok) == ("reproduce", False)
    assert "max abs difference 0.01 " in tampered.detail, tampered.detail
    assert "10 of 10 values beyond atol 1e-05 + rtol 0.0001 * |recorded|" in tampered.detail, tampered.detail


def test_non_finite_outputs_are_named_not_measured(tmp_path, device):
    """Finite weights whose outputs overflow: the line names the non-finite outputs, with no max abs."""
    good = write_checkpoint(tmp_path / "good.ckpt", device)

    def huge_output_layer(ckpt):
        ckpt["state_dict"]["net.out.weight"].fill_(3e38)

    _with_state(good, tmp_path / "bad" / "overflow.ckpt", huge_output_layer)
    (result,) = checkpoint_audit.audit_checkpoints(tmp_path / "bad", build_network, device=device)
    assert (result.stage, result.ok) == ("reproduce", False)
    assert "outputs on the recorded test inputs hold 10 non-finite value(s) of 10" in result.detail, result.detail
    assert torch.isnan(torch.tensor(result.max_abs))


# --------------------------------------------------------------------------------------------------
# What a resume needs, on a checkpoint written by a real (tiny, in-process) training run


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory) -> Path:
    from tests.training.helpers import train

    root = tmp_path_factory.mktemp("tiny_run")
    train(root, "trainer.max_steps=2")
    (last,) = root.glob("checkpoints/*/version_0/last.ckpt")
    return last


def _set(*keys, value):
    def edit(ckpt):
        tree = ckpt
        for k in keys[:-1]:
            tree = tree[k]
        if value is KeyError:
            del tree[keys[-1]]
        else:
            tree[keys[-1]] = value(tree[keys[-1]]) if callable(value) else value

    return edit


DAMAGES = {
    "adam_nan": (
        _set("optimizer_states", 0, "state", 2, "exp_avg", value=lambda t: t.fill_(float("nan"))),
        "optimizer: parameter 2 exp_avg (257 NaN, 0 inf of 257 values)",
    ),
    "adam_shape": (
        _set("optimizer_states", 0, "state", 0, "exp_avg_sq", value=lambda t: t[:, :3].clone()),
        "optimizer: parameter 0 exp_avg_sq of shape (257, 3); the parameter's is (257, 64)",
    ),
    "adam_missing": (_set("optimizer_states", value=KeyError), "no optimizer state"),
    "adam_step": (
        _set("optimizer_states", 0, "state", 4, "step", value=lambda t: t + 5),
        "optimizer: parameter 4 step tensor(7.); expected a whole number from 0 to the global step 2",
    ),
    "rng": (_set("rng", value=KeyError), "no random generator state (rng.torch)"),
    "data_position": (
        _set("loops", "fit_loop", "state_dict", "combined_loader", value=KeyError),
        "no training data position",
    ),
    "data_layout": (
        _set("loops", "fit_loop", "state_dict", "combined_loader", 0, "num_batches", value=3),
        "training data position: 3 global batches of 32",
    ),
    "loop_counter": (
        _set("global_step", value=5),
        "loops: 2 optimizer steps, but global_step is 5",
    ),
    "call_counts": (_set("calls", value=KeyError), "no call counts (calls)"),
    "parity_verdicts": (_set("callbacks", value=KeyError), "no parity verdicts (callbacks.Parity)"),
}


def test_a_real_checkpoint_holds_everything_a_resume_needs(trained_checkpoint, device):
    results = checkpoint_audit.audit_checkpoints(trained_checkpoint.parent, device=device)
    assert {Path(r.file).name for r in results} >= {"last.ckpt", "final.ckpt"}
    for result in results:
        expected = ("verified", True) if Path(result.file).suffix == ".ckpt" else ("skipped", True)  # end.json
        assert (result.stage, result.ok) == expected, (result.file, result.detail)


def test_each_part_of_the_resume_state_that_is_damaged_fails_the_file_naming_it(trained_checkpoint, tmp_path, device):
    for name, (edit, _) in DAMAGES.items():
        _with_state(trained_checkpoint, tmp_path / f"{name}.ckpt", edit)
    results = {Path(r.file).stem: r for r in checkpoint_audit.audit_checkpoints(tmp_path, device=device)}
    assert set(results) == set(DAMAGES)
    for name, (_, words) in DAMAGES.items():
        r = results[name]
        assert (r.stage, r.ok) == ("resume", False), (name, r.stage, r.detail)
        assert r.detail.startswith("cannot be resumed: ") and words in r.detail, (name, r.detail)
        assert "\n" not in r.detail


def test_check_checkpoints_fails_on_a_checkpoint_whose_adam_state_is_nan(trained_checkpoint, tmp_path, capsys):
    from .helpers import read_report, run_cli

    edit, _ = DAMAGES["adam_nan"]
    _with_state(trained_checkpoint, tmp_path / "ckpts" / "bad.ckpt", edit)
    _with_state(trained_checkpoint, tmp_path / "ckpts" / "good.ckpt", lambda ckpt: None)
    rc, out, _ = run_cli(capsys, "check-checkpoints", "--checkpoints", tmp_path / "ckpts", "--outputs", tmp_path / "o")
    assert rc == 1
    (line,) = [ln for ln in out.splitlines() if "bad.ckpt" in ln and "resume" in ln]
    assert "FAIL" in line and "exp_avg" in line
    assert "1 of 2 checkpoint(s) verified; failing:" in out
    files = {Path(f["file"]).name: f for f in read_report(tmp_path / "o", "check-checkpoints")["files"]}
    assert (files["bad.ckpt"]["stage"], files["good.ckpt"]["stage"]) == ("resume", "verified")
