"""Each ``rmsnorm-kernel`` command (``checks.commands``): its success, and a failure that exits 1. In-process
through ``main``, except the tests whose subject is the process."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel import rmsnorm
from rmsnorm_kernel.checks import campaigns, compile_report, exercise, gradients, negative, profile
from rmsnorm_kernel.checks.main import main
from rmsnorm_kernel.ops.reference import rmsnorm_reference
from rmsnorm_kernel.testing import Violation, forward_block_mean

from .helpers import BreakingNet, make_project, read_report, run_cli, write_checkpoint

CAMPAIGN_COMMANDS = ["check-forward", "check-backward", "check-gamma", "check-residual"]
DTYPE_NAMES = {"float32", "float16", "bfloat16"}


def run_process(*argv, cwd, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "rmsnorm_kernel", *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --------------------------------------------------------------------------------------------------
# environment and reference


def test_environment_passes_and_reports_the_facts(tmp_path, capsys):
    rc, out, _ = run_cli(capsys, "environment", "--outputs", tmp_path)
    rep = read_report(tmp_path, "environment")
    assert rc == 0 and "PASS" in out
    assert rep["ok"] is True and rep["facts"]["torch"] == torch.__version__
    assert [c["campaign"] for c in rep["proof"]] == ["forward", "dx", "dgamma", "residual"]


def test_environment_fails_when_the_kernel_is_wrong(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(campaigns.KERNELS["forward"], "triton", forward_block_mean)
    rc, out, _ = run_cli(capsys, "environment", "--outputs", tmp_path)
    assert rc == 1 and "FAIL" in out
    assert read_report(tmp_path, "environment")["ok"] is False


@pytest.mark.slow
def test_environment_runs_as_a_module_in_a_fresh_process(tmp_path):
    proc = run_process("environment", "--outputs", tmp_path, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "triton" in proc.stdout
    rep = read_report(tmp_path, "environment")
    assert rep["ok"] is True
    assert rep["facts"]["torch"] == torch.__version__
    assert rep["facts"]["CUDA device visible"] == str(torch.cuda.is_available())


def test_reference_passes_and_fails_with_a_wrong_manual_backward(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gradients, "REFERENCE_SHAPES", ((3, 7),))
    rc, out, _ = run_cli(capsys, "reference", "--outputs", tmp_path)
    assert rc == 0 and "gradcheck" in out
    cases = read_report(tmp_path, "reference")["cases"]
    assert cases and all(c["ok"] for c in cases)
    monkeypatch.setattr(gradients, "manual_backward", lambda x, gamma, dy, eps: (dy, gamma))
    rc, _, _ = run_cli(capsys, "reference", "--outputs", tmp_path)
    assert rc == 1


# --------------------------------------------------------------------------------------------------
# The campaigns


@pytest.mark.parametrize("command", CAMPAIGN_COMMANDS)
def test_quick_campaign_passes_and_reports_every_case(command, tmp_path, capsys):
    rc, out, _ = run_cli(capsys, command, "--quick", "--outputs", tmp_path)
    rep = read_report(tmp_path, command)
    assert rc == 0, out
    assert rep["ok"] is True and rep["quick"] is True and rep["kernel"] == "triton"
    assert len(rep["cases"]) == rep["summary"]["cases"] == rep["summary"]["passed"] == len(campaigns.QUICK_SHAPES) * 3
    assert {tuple(c["shape"]) for c in rep["cases"]} == set(campaigns.QUICK_SHAPES)
    assert {c["dtype"] for c in rep["cases"]} == set(rep["summary"]["worst_per_dtype"]) == DTYPE_NAMES
    for c in rep["cases"]:
        assert (c["atol"], c["rtol"]) == (rep["tolerances"][c["dtype"]]["atol"], rep["tolerances"][c["dtype"]]["rtol"])
    assert "Worst case per dtype" in out and "tolerances" in out


def test_campaign_without_quick_runs_the_full_shape_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(campaigns, "FULL_SHAPES", ((2, 33), (1, 3, 7)))  # small stand-ins for the full list
    rc, _, _ = run_cli(capsys, "check-forward", "--outputs", tmp_path)
    rep = read_report(tmp_path, "check-forward")
    assert rc == 0 and rep["quick"] is False
    assert [tuple(c["shape"]) for c in rep["cases"]] == [(2, 33)] * 3 + [(1, 3, 7)] * 3


@pytest.mark.slow
@pytest.mark.parametrize("command", CAMPAIGN_COMMANDS)
def test_full_campaign_passes_end_to_end_in_a_process(command, tmp_path):
    proc = run_process(command, "--outputs", tmp_path, cwd=tmp_path)
    rep = read_report(tmp_path, command)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rep["ok"] is True and rep["quick"] is False
    assert len(rep["cases"]) == rep["summary"]["cases"] == rep["summary"]["passed"] == 90
    assert {tuple(c["shape"]) for c in rep["cases"]} == set(campaigns.FULL_SHAPES)
    assert {c["dtype"] for c in rep["cases"]} == set(rep["summary"]["worst_per_dtype"]) == DTYPE_NAMES
    assert "Worst case per dtype" in proc.stdout


@pytest.mark.parametrize("command", ["check-forward", "check-backward"])
def test_campaign_with_the_block_mean_mutant_fails_at_257_not_256(command, tmp_path, capsys):
    rc, out, _ = run_cli(capsys, command, "--quick", "--kernel", "block-mean", "--outputs", tmp_path)
    rep = read_report(tmp_path, command)
    assert rc == 1 and "FAIL" in out
    assert rep["ok"] is False and rep["kernel"] == "block-mean"
    failing_n = {c["shape"][-1] for c in rep["cases"] if not c["ok"]}
    assert 257 in failing_n and 256 not in failing_n


def test_gamma_campaign_fails_on_a_wrong_dgamma(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(
        campaigns.KERNELS["dgamma"], "triton", lambda dy, x, gamma, eps: -campaigns.triton_dgamma(dy, x, gamma, eps)
    )
    monkeypatch.setattr(campaigns, "QUICK_SHAPES", ((2, 33),))
    rc, _, _ = run_cli(capsys, "check-gamma", "--quick", "--outputs", tmp_path)
    rep = read_report(tmp_path, "check-gamma")
    assert rc == 1 and len(rep["cases"]) == 3
    assert not any(c["ok"] for c in rep["cases"])


def test_gamma_campaign_has_no_mutant_to_choose(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check-gamma", "--kernel", "block-mean"])
    assert exc.value.code == 2
    assert "invalid choice: 'block-mean'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# negative, exercise, profile, compile-report


def test_negative_passes_and_fails_when_a_violation_is_accepted(tmp_path, capsys, monkeypatch):
    rc, out, _ = run_cli(capsys, "negative", "--quick", "--outputs", tmp_path)
    rep = read_report(tmp_path, "negative")
    assert rc == 0, out
    assert {c["name"] for c in rep["cases"]} >= {v.name for v in negative.CONTRACT_VIOLATIONS}
    assert {c["kind"] for c in rep["cases"]} == {"contract", "control", "mutant"}
    assert {tuple(c["shape"]) for c in rep["mutant_campaign_cases"]} == set(campaigns.QUICK_SHAPES)
    accepted = Violation(
        "accepted_input", "x", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 1e-6), "x"
    )
    monkeypatch.setattr(negative, "CONTRACT_VIOLATIONS", (accepted,))
    monkeypatch.setattr(campaigns, "QUICK_SHAPES", ((1, 257),))
    rc, out, _ = run_cli(capsys, "negative", "--quick", "--outputs", tmp_path)
    assert rc == 1 and "accepted_input" in out


def test_exercise_passes_and_fails_when_the_mutant_is_fixed(tmp_path, capsys, monkeypatch):
    rc, out, _ = run_cli(capsys, "exercise", "--outputs", tmp_path)
    assert rc == 0
    assert "1.411458" in out and "0.9999995" in out
    monkeypatch.setattr(exercise, "forward_block_mean", rmsnorm)
    rc, _, _ = run_cli(capsys, "exercise", "--outputs", tmp_path)
    assert rc == 1
    assert read_report(tmp_path, "exercise")["ok"] is False


def test_profile_passes_and_fails_when_the_triton_path_falls_back(tmp_path, capsys, device, monkeypatch):
    rc, out, _ = run_cli(capsys, "profile", "--shape", 4, 33, "--outputs", tmp_path)
    rep = read_report(tmp_path, "profile")
    assert rc == 0, out
    assert rep["shape"] == [4, 33] and len(rep["rows"]) == 6
    if device == "cpu":
        assert rep["unit"] == "CPU operator calls" and "CPU operator counts" in out
    else:
        assert rep["unit"] == "GPU kernels"
    monkeypatch.setattr(profile, "rmsnorm", rmsnorm_reference)
    rc, out, _ = run_cli(capsys, "profile", "--shape", 4, 33, "--outputs", tmp_path)
    assert rc == 1 and "Triton op calls" in out


def test_compile_report_passes_and_fails_on_a_graph_break(tmp_path, capsys, monkeypatch):
    rc, out, _ = run_cli(capsys, "compile-report", "--outputs", tmp_path)
    rep = read_report(tmp_path, "compile-report")["report"]
    assert rc == 0, out
    assert rep["code_files"] and all(Path(f).parent == tmp_path / "compile-report" for f in rep["code_files"])
    # the line that runs the forward, marked: a kernel launch on a GPU, the opaque op under the interpreter
    assert any(
        line.lstrip().startswith(">> ") and compile_report.LAUNCHES["forward"].search(line) for line in out.splitlines()
    )
    monkeypatch.setattr(compile_report, "demo_network", BreakingNet)
    rc, out, _ = run_cli(capsys, "compile-report", "--outputs", tmp_path)
    assert rc == 1 and "graph break" in out


# --------------------------------------------------------------------------------------------------
# check-checkpoints and clean


def test_check_checkpoints_verifies_and_names_a_damaged_file(tmp_path, capsys, device):
    from rmsnorm_kernel.training.network import build_network

    root = tmp_path / "checkpoints"
    write_checkpoint(root / "triton_seed0" / "good.ckpt", device, builder=build_network)
    rc, out, _ = run_cli(capsys, "check-checkpoints", "--checkpoints", root, "--outputs", tmp_path)
    assert rc == 0, out
    (root / "triton_seed0" / "broken.ckpt").write_bytes(b"garbage")
    rc, out, _ = run_cli(capsys, "check-checkpoints", "--checkpoints", root, "--outputs", tmp_path)
    files = {Path(f["file"]).name: f for f in read_report(tmp_path, "check-checkpoints")["files"]}
    assert rc == 1
    assert "broken.ckpt" in out.split("FAIL:")[-1]  # named in the summary line
    assert files["good.ckpt"]["ok"] and not files["broken.ckpt"]["ok"]


def test_check_checkpoints_without_checkpoints_fails(tmp_path, capsys):
    rc, out, _ = run_cli(capsys, "check-checkpoints", "--checkpoints", tmp_path / "none", "--outputs", tmp_path)
    assert rc == 1 and "nothing was verified" in out


def test_clean_dry_run_removes_nothing_then_clean_removes(tmp_path, capsys, monkeypatch):
    root = make_project(tmp_path / "proj")
    monkeypatch.chdir(root)
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated", "--dry-run")
    assert rc == 0 and "would remove" in out
    assert (root / "runs" / "triton_seed0" / "version_0" / "events.out.tfevents.1").exists()
    assert not (root / "outputs" / "clean.json").exists()  # the dry run writes nothing
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated")
    assert rc == 0 and "removed" in out
    assert not (root / "runs").exists() and not (root / "outputs").exists()
    assert (root / "src" / "pkg" / "mod.py").exists()


def test_clean_requires_a_scope(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["clean", "--dry-run"])
    assert exc.value.code == 2
