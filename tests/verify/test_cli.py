"""``python -m rmsnorm_kernel <command>``: each command's success path and a failure that must exit non-zero."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from rmsnorm_kernel import checks, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.cli import main
from rmsnorm_kernel.mutants import forward_block_mean

from .test_checks import _BreakingNet, make_project, write_checkpoint


def run(capsys, *argv):
    """(exit status, stdout, stderr) of ``main(argv)`` run in this process."""
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def report(outputs: Path, command: str) -> dict:
    return json.loads((outputs / f"{command}.json").read_text())


def test_environment_runs_as_a_module_in_a_fresh_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rmsnorm_kernel", "environment", "--outputs", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "triton" in proc.stdout
    rep = report(tmp_path, "environment")
    assert rep["ok"] is True
    assert rep["facts"]["torch"] == torch.__version__
    assert rep["facts"]["CUDA device visible"] == str(torch.cuda.is_available())


def test_environment_fails_when_the_kernel_is_wrong(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(checks.KERNELS["forward"], "triton", forward_block_mean)
    rc, out, _ = run(capsys, "environment", "--outputs", tmp_path)
    assert rc == 1 and "FAIL" in out
    assert report(tmp_path, "environment")["ok"] is False


def test_reference_passes_and_fails_with_a_wrong_manual_backward(tmp_path, capsys, monkeypatch):
    rc, out, _ = run(capsys, "reference", "--outputs", tmp_path)
    assert rc == 0 and "gradcheck" in out
    assert all(c["ok"] for c in report(tmp_path, "reference")["cases"])
    monkeypatch.setattr(checks, "manual_backward", lambda x, gamma, dy, eps: (dy, gamma))
    rc, _, _ = run(capsys, "reference", "--outputs", tmp_path)
    assert rc == 1


@pytest.mark.parametrize("command", ["check-forward", "check-backward", "check-gamma"])
def test_campaign_by_default_runs_the_full_campaign_and_passes(command, tmp_path, capsys):
    rc, out, _ = run(capsys, command, "--outputs", tmp_path)
    rep = report(tmp_path, command)
    assert rc == 0, out
    assert rep["ok"] is True and rep["quick"] is False
    assert len(rep["cases"]) == rep["summary"]["cases"] == rep["summary"]["passed"] >= 72
    assert {c["dtype"] for c in rep["cases"]} == {"float32", "float16", "bfloat16"}
    assert set(rep["summary"]["worst_per_dtype"]) == {"float32", "float16", "bfloat16"}
    for c in rep["cases"]:
        assert c["atol"] == rep["tolerances"][c["dtype"]]["atol"]
    assert "Worst case per dtype" in out and "tolerances" in out


@pytest.mark.parametrize("command", ["check-forward", "check-backward"])
def test_campaign_with_the_block_mean_mutant_fails(command, tmp_path, capsys):
    rc, out, _ = run(capsys, command, "--quick", "--kernel", "block-mean", "--outputs", tmp_path)
    rep = report(tmp_path, command)
    assert rc == 1
    assert rep["ok"] is False and rep["kernel"] == "block-mean"
    failing_n = {c["shape"][-1] for c in rep["cases"] if not c["ok"]}
    assert 257 in failing_n and 256 not in failing_n
    assert "FAIL" in out


def test_gamma_campaign_fails_on_a_wrong_dgamma(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(checks.KERNELS["dgamma"], "triton", lambda dy, x, gamma, eps: -checks.triton_dgamma(dy, x, gamma, eps))
    rc, _, _ = run(capsys, "check-gamma", "--quick", "--outputs", tmp_path)
    rep = report(tmp_path, "check-gamma")
    assert rc == 1 and len(rep["cases"]) == len(checks.QUICK_SHAPES) * 3
    assert not any(c["ok"] for c in rep["cases"])


def test_gamma_campaign_has_no_mutant_to_choose(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check-gamma", "--kernel", "block-mean"])
    assert exc.value.code == 2
    assert "invalid choice: 'block-mean'" in capsys.readouterr().err


def test_negative_passes_and_fails_when_a_violation_is_accepted(tmp_path, capsys, monkeypatch):
    rc, out, _ = run(capsys, "negative", "--quick", "--outputs", tmp_path)
    rep = report(tmp_path, "negative")
    assert rc == 0, out
    assert {c["name"] for c in rep["cases"]} >= {v.name for v in checks.CONTRACT_VIOLATIONS}
    assert {c["kind"] for c in rep["cases"]} == {"contract", "control", "mutant"}
    accepted = checks.Violation("accepted_input", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 1e-6), "x")
    monkeypatch.setattr(checks, "CONTRACT_VIOLATIONS", (accepted,))
    rc, out, _ = run(capsys, "negative", "--quick", "--outputs", tmp_path)
    assert rc == 1 and "accepted_input" in out


def test_exercise_passes_and_fails_when_the_mutant_is_fixed(tmp_path, capsys, monkeypatch):
    rc, out, _ = run(capsys, "exercise", "--outputs", tmp_path)
    assert rc == 0
    assert "1.411458" in out and "0.9999995" in out
    monkeypatch.setattr(checks, "forward_block_mean", rmsnorm)
    rc, _, _ = run(capsys, "exercise", "--outputs", tmp_path)
    assert rc == 1
    assert report(tmp_path, "exercise")["ok"] is False


def test_profile_counts_each_path(tmp_path, capsys, device):
    rc, out, _ = run(capsys, "profile", "--shape", 8, 257, "--outputs", tmp_path)
    rep = report(tmp_path, "profile")
    assert rc == 0, out
    assert [(r["path"], r["phase"]) for r in rep["rows"]] == [
        (p, ph) for p in ("reference", "triton", "torch.compile(reference)") for ph in ("forward", "forward+backward")
    ]
    assert all(r["count"] > 0 for r in rep["rows"])
    if device == "cpu":
        assert rep["unit"] == "CPU operator calls" and "CPU operator counts" in out
    else:
        assert rep["unit"] == "GPU kernels"


def test_profile_fails_when_the_triton_path_falls_back(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checks, "rmsnorm", rmsnorm_reference)
    rc, out, _ = run(capsys, "profile", "--shape", 4, 33, "--outputs", tmp_path)
    assert rc == 1 and "Triton op calls" in out


def test_compile_report_saves_inductor_code_calling_the_op(tmp_path, capsys):
    rc, out, _ = run(capsys, "compile-report", "--outputs", tmp_path)
    rep = report(tmp_path, "compile-report")["report"]
    assert rc == 0, out
    assert rep["graph_break_count"] == 0
    code = "\n".join(Path(f).read_text() for f in rep["code_files"])
    assert all(Path(f).parent == tmp_path / "compile-report" for f in rep["code_files"])
    assert "torch.ops.rmsnorm_kernel.rmsnorm.default(" in code
    assert "torch.ops.rmsnorm_kernel.rmsnorm_backward.default(" in code
    assert ">> " in out and "torch.ops.rmsnorm_kernel.rmsnorm.default(" in out


def test_compile_report_fails_on_a_graph_break(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checks, "SmallNet", _BreakingNet)
    rc, out, _ = run(capsys, "compile-report", "--outputs", tmp_path)
    assert rc == 1 and "graph break" in out


def test_check_checkpoints_verifies_and_names_a_damaged_file(tmp_path, capsys, device):
    pytest.importorskip("rmsnorm_kernel.model")
    from rmsnorm_kernel.model import build_network

    root = tmp_path / "checkpoints"
    write_checkpoint(root / "triton_seed0" / "good.ckpt", device, builder=build_network)
    rc, out, _ = run(capsys, "check-checkpoints", "--checkpoints", root, "--outputs", tmp_path)
    assert rc == 0, out
    (root / "triton_seed0" / "broken.ckpt").write_bytes(b"garbage")
    rc, out, _ = run(capsys, "check-checkpoints", "--checkpoints", root, "--outputs", tmp_path)
    files = {Path(f["file"]).name: f for f in report(tmp_path, "check-checkpoints")["files"]}
    assert rc == 1
    assert "broken.ckpt" in out.split("FAIL:")[-1]  # named in the summary line
    assert files["good.ckpt"]["ok"] and not files["broken.ckpt"]["ok"]


def test_check_checkpoints_without_checkpoints_fails(tmp_path, capsys):
    rc, out, _ = run(capsys, "check-checkpoints", "--checkpoints", tmp_path / "none", "--outputs", tmp_path)
    assert rc == 1 and "nothing was verified" in out


def test_clean_dry_run_removes_nothing_then_clean_removes(tmp_path, capsys, monkeypatch):
    root = make_project(tmp_path / "proj")
    monkeypatch.chdir(root)
    rc, out, _ = run(capsys, "clean", "--scope", "generated", "--dry-run")
    assert rc == 0 and "would remove" in out
    assert (root / "runs" / "triton_seed0" / "events.out.tfevents.1").exists()
    assert report(root / "outputs", "clean")["dry_run"] is True
    rc, out, _ = run(capsys, "clean", "--scope", "generated")
    assert rc == 0 and "removed" in out
    assert not (root / "runs").exists() and not (root / "outputs").exists()
    assert (root / "src" / "pkg" / "mod.py").exists()


def test_clean_refuses_outside_the_project(tmp_path, capsys, monkeypatch):
    stranger = tmp_path / "stranger"
    (stranger / "outputs").mkdir(parents=True)
    monkeypatch.chdir(stranger)
    rc, _, err = run(capsys, "clean", "--scope", "generated")
    assert rc == 2 and "no pyproject.toml" in err
    assert (stranger / "outputs").is_dir()


def test_clean_requires_a_scope(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["clean", "--dry-run"])
    assert exc.value.code == 2


def test_benchmark_without_its_module_exits_2(capsys, monkeypatch):
    import rmsnorm_kernel

    monkeypatch.setitem(sys.modules, "rmsnorm_kernel.benchmark", None)  # makes the import fail
    monkeypatch.delattr(rmsnorm_kernel, "benchmark", raising=False)
    rc, _, err = run(capsys, "benchmark", "--quick")
    assert rc == 2 and "rmsnorm_kernel.benchmark is not available" in err


def test_benchmark_options_and_run_come_from_its_module(capsys, monkeypatch):
    seen = {}

    def fake_run(args):
        seen["rows"] = args.rows
        return 3

    fake = types.ModuleType("rmsnorm_kernel.benchmark")
    fake.add_arguments = lambda parser: parser.add_argument("--rows", type=int, default=1)
    fake.run = fake_run
    monkeypatch.setitem(sys.modules, "rmsnorm_kernel.benchmark", fake)
    import rmsnorm_kernel

    monkeypatch.setattr(rmsnorm_kernel, "benchmark", fake, raising=False)
    assert main(["benchmark", "--rows", "7"]) == 3
    assert seen == {"rows": 7}
    with pytest.raises(SystemExit) as exc:
        main(["benchmark", "--help"])
    assert exc.value.code == 0 and "--rows" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "check-forward" in capsys.readouterr().out


def test_unknown_option_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["exercise", "--fast"])
    assert exc.value.code == 2 and "--fast" in capsys.readouterr().err
