"""The check functions behind the command line: what they try, and that they fail when they should."""

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from rmsnorm_kernel import ContractError, checks, housekeeping, kernels, rmsnorm, rmsnorm_reference
from rmsnorm_kernel.checks import CampaignCase, Violation
from rmsnorm_kernel.module import RMSNorm
from rmsnorm_kernel.mutants import forward_block_mean

# --------------------------------------------------------------------------------------------------
# Campaigns


def test_full_campaign_covers_what_the_issue_asks():
    shapes, dtypes = checks.FULL_SHAPES, checks.DTYPES
    assert len(shapes) * len(dtypes) >= 72
    assert set(dtypes) == {torch.float32, torch.float16, torch.bfloat16}
    rows = {math.prod(s[:-1]) for s in shapes}
    ns = {s[-1] for s in shapes}
    assert {1, 17} <= rows
    assert {255, 256, 257} <= ns
    assert len([n for n in ns if not checks.is_power_of_two(n)]) >= 10
    assert any(len(s) > 2 for s in shapes)


def test_quick_campaign_still_has_both_sides_of_a_power_of_two():
    ns = {s[-1] for s in checks.QUICK_SHAPES}
    assert {math.prod(s[:-1]) for s in checks.QUICK_SHAPES} >= {1, 17}
    assert any(checks.is_power_of_two(n) for n in ns) and any(not checks.is_power_of_two(n) for n in ns)


@pytest.mark.parametrize("dtype", checks.DTYPES, ids=str)
def test_campaign_gamma_is_never_all_ones(dtype):
    for seed, shape in enumerate(checks.FULL_SHAPES):
        _, gamma, _ = checks.campaign_inputs(shape, dtype, "cpu", seed)
        assert not torch.all(gamma == 1), shape


def test_campaign_gives_one_record_per_shape_and_dtype(device):
    shapes = [(1, 257), (3, 2, 33)]
    cases = checks.run_campaign("forward", shapes=shapes, device=device)
    assert [(c.shape, c.dtype) for c in cases] == [(s, checks.dtype_name(d)) for s in shapes for d in checks.DTYPES]
    assert len({c.seed for c in cases}) == len(cases)
    assert all(c.ok and math.isfinite(c.max_abs) and not c.error for c in cases)


def test_mutant_forward_fails_at_257_and_hides_at_256(device):
    cases = checks.run_campaign("forward", kernel="block-mean", shapes=[(17, 256), (17, 257)], dtypes=[torch.float32], device=device)
    at = {c.shape[-1]: c for c in cases}
    assert at[256].ok
    assert not at[257].ok and at[257].max_rel > 0.1


def test_mutant_dx_fails_at_257(device):
    (case,) = checks.run_campaign("dx", kernel="block-mean", shapes=[(17, 257)], dtypes=[torch.float32], device=device)
    assert not case.ok


def test_dgamma_campaign_catches_a_wrong_dgamma(device, monkeypatch):
    def doubled(dy, x, gamma, eps):
        return 2 * checks.triton_dgamma(dy, x, gamma, eps)

    monkeypatch.setitem(checks.KERNELS["dgamma"], "doubled", doubled)
    cases = checks.run_campaign("dgamma", kernel="doubled", shapes=[(5, 40)], device=device)
    assert not any(c.ok for c in cases)


def test_a_crashing_kernel_fails_its_case_and_the_campaign_goes_on(device, monkeypatch):
    def crash(x, gamma, eps):
        raise RuntimeError("launch failed")

    monkeypatch.setitem(checks.KERNELS["forward"], "crash", crash)
    cases = checks.run_campaign("forward", kernel="crash", shapes=[(2, 8), (3, 9)], dtypes=[torch.float32], device=device)
    assert len(cases) == 2
    assert all(not c.ok and "RuntimeError: launch failed" in c.error for c in cases)


def test_unknown_campaign_or_kernel_names_what_is_accepted():
    with pytest.raises(ValueError, match="campaign is 'y'; accepted: forward, dx, dgamma"):
        checks.run_campaign("y")
    with pytest.raises(ValueError, match="kernel 'block-mean' has no dgamma variant; accepted: triton"):
        checks.run_campaign("dgamma", kernel="block-mean")


def _case(dtype, max_abs, ok):
    return CampaignCase("forward", "triton", dtype, (1, 2), 0, max_abs, max_abs, 1e-5, 1e-4, ok)


def test_worst_case_per_dtype_prefers_a_failure_over_a_larger_passing_error():
    cases = [_case("float32", 1e-6, True), _case("float32", 5e-7, False), _case("float16", 1e-4, True), _case("float16", 2e-3, True)]
    worst = checks.worst_per_dtype(cases)
    assert worst["float32"] is cases[1]
    assert worst["float16"] is cases[3]


# --------------------------------------------------------------------------------------------------
# Environment and reference


def test_environment_names_the_backend_and_proves_the_kernel_runs(device):
    facts = {f.item: f.value for f in checks.environment_facts()}
    assert facts["torch"] == torch.__version__
    assert facts["rmsnorm_kernel backend"] == ("cuda" if device == "cuda" else "interpreter")
    assert ("GPU 0" in facts) == torch.cuda.is_available()
    proof = checks.environment_proof(device=device)
    assert [c.campaign for c in proof] == list(checks.CAMPAIGNS) and all(c.ok for c in proof)


def test_reference_checks_pass_and_catch_a_wrong_manual_backward(monkeypatch):
    results = checks.reference_checks(shapes=[(3, 7)])
    assert {r.check for r in results} == {"gradcheck", "manual dx = autograd", "manual dgamma = autograd"}
    assert all(r.ok for r in results)

    real = checks.manual_backward

    def dgamma_as_mean(x, gamma, dy, eps):  # a classic slip: averaging dgamma over rows instead of summing
        dx, dgamma = real(x, gamma, dy, eps)
        return dx, dgamma / x.shape[0]

    monkeypatch.setattr(checks, "manual_backward", dgamma_as_mean)
    results = checks.reference_checks(shapes=[(3, 7)])
    assert not any(r.ok for r in results if r.check == "manual dgamma = autograd")
    assert all(r.ok for r in results if r.check != "manual dgamma = autograd")


# --------------------------------------------------------------------------------------------------
# Negative checks


def test_every_violation_is_refused_before_any_launch(device):
    results, mutant_cases = checks.negative_checks(mutant_shapes=checks.QUICK_SHAPES, device=device)
    by_name = {r.name: r for r in results}
    assert {v.name for v in checks.CONTRACT_VIOLATIONS} <= set(by_name)
    for r in results:
        assert r.ok, (r.name, r.outcome)
    assert by_name["valid_input_trips_the_wire"].kind == "control"
    assert [r.kind for r in results].count("mutant") == 2
    assert mutant_cases and any(not c.ok for c in mutant_cases)


def test_violation_list_builds_inputs_the_contract_refuses(device):
    for v in checks.CONTRACT_VIOLATIONS:
        try:
            x, gamma, eps = v.build(device)
        except checks.NotApplicable:
            continue
        with pytest.raises(ContractError):
            rmsnorm(x.requires_grad_() if v.requires_grad else x, gamma, eps)


def test_an_accepted_input_listed_as_a_violation_fails_the_negative_check(device):
    accepted = Violation("valid", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 1e-6), r"anything")
    results, _ = checks.negative_checks(violations=[accepted], mutant_shapes=[(1, 257)], device=device)
    (case,) = [r for r in results if r.name == "valid"]
    assert not case.ok and "not refused before a launch" in case.outcome


def test_a_refusal_with_the_wrong_message_fails(device):
    wrong = Violation("eps_zero", lambda d: (torch.randn(2, 8, device=d), torch.ones(8, device=d), 0.0), r"gamma has dtype")
    results, _ = checks.negative_checks(violations=[wrong], mutant_shapes=[(1, 257)], device=device)
    assert not results[0].ok and "message does not match" in results[0].outcome


def test_a_mutant_that_is_not_caught_fails_the_negative_check(device, monkeypatch):
    monkeypatch.setitem(checks.KERNELS["forward"], "block-mean", rmsnorm)  # the "mutant" is the real kernel
    results, _ = checks.negative_checks(violations=[], mutant_shapes=[(1, 257)], device=device)
    (forward,) = [r for r in results if r.name.startswith("forward")]
    assert not forward.ok and "caught in 0 of" in forward.outcome


def test_tripwire_catches_a_launch_and_restores_the_kernels(device):
    before = dict(vars(kernels))
    x, gamma, _ = checks.campaign_inputs((2, 8), torch.float32, device, 0)
    with checks.kernel_launches_forbidden() as replaced:
        assert replaced
        with pytest.raises(checks.KernelLaunched):
            rmsnorm(x, gamma)
    assert all(vars(kernels)[k] is v for k, v in before.items())
    assert checks.compare(rmsnorm(x, gamma), rmsnorm_reference(x, gamma)).ok


# --------------------------------------------------------------------------------------------------
# Exercise


def test_exercise_shows_the_defect_at_257_and_not_at_256(device):
    rows = checks.exercise(device=device)
    assert all(r.ok for r in rows)
    fwd = {(r.n, r.kernel): r for r in rows if r.what.startswith("forward")}
    eps = 1e-6
    assert fwd[257, "triton"].value == pytest.approx(1 / math.sqrt(1 + eps), abs=1e-6)
    assert fwd[257, "block-mean"].value == pytest.approx(1 / math.sqrt(257 / 512 + eps), abs=1e-6)
    assert fwd[257, "block-mean"].value == pytest.approx(1.411458, abs=1e-6)
    assert fwd[256, "block-mean"].value == fwd[256, "triton"].value
    bwd = {(r.n, r.kernel): r for r in rows if r.what.startswith("backward")}
    assert not bwd[257, "block-mean"].agrees_with_reference and bwd[256, "block-mean"].agrees_with_reference


def test_exercise_fails_when_the_broken_kernel_is_fixed(device, monkeypatch):
    monkeypatch.setattr(checks, "forward_block_mean", rmsnorm)
    rows = checks.exercise(device=device)
    (row,) = [r for r in rows if r.what.startswith("forward") and r.n == 257 and r.kernel == "block-mean"]
    assert not row.ok


# --------------------------------------------------------------------------------------------------
# Profile and compile report


def test_profile_fails_when_the_triton_path_is_not_taken(device, monkeypatch):
    monkeypatch.setattr(checks, "rmsnorm", rmsnorm_reference)
    rows = checks.profile_counts(shape=(4, 33), device=device)
    triton_rows = [r for r in rows if r.path == "triton"]
    assert len(triton_rows) == 2 and not any(r.ok for r in triton_rows)
    assert all(r.ok for r in rows if r.path != "triton")


class _BreakingNet(checks.SmallNet):
    def forward(self, x):
        h = self.norm(self.inp(x))
        if h.sum().item() > 1e30:  # data-dependent Python control flow: a graph break
            h = h * 2
        return self.out(torch.nn.functional.silu(h))


def test_compile_report_reports_graph_breaks(tmp_path, device, monkeypatch):
    monkeypatch.setattr(checks, "SmallNet", _BreakingNet)
    rep = checks.compile_report(tmp_path / "code", device=device)
    assert not rep.ok
    assert rep.graph_break_count >= 1 and "graph break" in rep.problems[0]


# --------------------------------------------------------------------------------------------------
# Checkpoint audit


def build_network(input_dim, hidden_dim, output_dim, norm_impl, eps):
    return nn.Sequential(OrderedDict(
        inp=nn.Linear(input_dim, hidden_dim), norm=RMSNorm(hidden_dim, eps=eps, impl=norm_impl),
        act=nn.SiLU(), out=nn.Linear(hidden_dim, output_dim),
    ))


HPARAMS = {"input_dim": 6, "hidden_dim": 33, "output_dim": 2, "norm_impl": "triton", "eps": 1e-6, "lr": 1e-3}


def write_checkpoint(path: Path, device: str, seed: int = 0, prefix: str = "net.", tamper: bool = False, builder=build_network) -> Path:
    """A checkpoint in the training's planned format: Lightning keys plus the recorded test outputs."""
    torch.manual_seed(seed)
    net = builder(**{k: v for k, v in HPARAMS.items() if k != "lr"}).to(device)
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        inputs = torch.randn(5, HPARAMS["input_dim"], device=device)
        outputs = net(inputs)
    if tamper:
        outputs = outputs + 0.01
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "epoch": 0, "global_step": 3, "pytorch-lightning_version": "2.5.0",
        "state_dict": {prefix + k: v.cpu() for k, v in net.state_dict().items()},
        "hyper_parameters": dict(HPARAMS),
        "rmsnorm_kernel": {"test_inputs": inputs.cpu(), "test_outputs": outputs.cpu()},
    }, path)
    return path


class NotAllowedUnderWeightsOnly:
    pass


@pytest.fixture
def checkpoint_dir(tmp_path, device):
    root = tmp_path / "checkpoints"
    write_checkpoint(root / "triton_seed0" / "version_0" / "last.ckpt", device)
    write_checkpoint(root / "triton_seed0" / "version_0" / "unprefixed.ckpt", device, seed=1, prefix="")
    write_checkpoint(root / "triton_seed1" / "tampered.ckpt", device, tamper=True)
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


def test_checkpoint_audit_verifies_good_files_and_names_each_bad_one(checkpoint_dir, device):
    results = {Path(r.file).relative_to(checkpoint_dir).as_posix(): r for r in checks.audit_checkpoints(checkpoint_dir, build_network, device=device)}
    assert results["triton_seed0/version_0/last.ckpt"].ok
    assert results["triton_seed0/version_0/last.ckpt"].stage == "verified"
    assert results["triton_seed0/version_0/unprefixed.ckpt"].ok
    assert (results["triton_seed1/tampered.ckpt"].stage, results["triton_seed1/tampered.ckpt"].ok) == ("reproduce", False)
    assert results["triton_seed1/tampered.ckpt"].max_abs == pytest.approx(0.01, rel=1e-3)
    for name in ("damaged/random.ckpt", "damaged/empty.ckpt", "damaged/truncated.ckpt", "foreign/pickled_object.ckpt"):
        assert (results[name].stage, results[name].ok) == ("load", False), name
    assert results["foreign/other.ckpt"].stage == "keys" and "missing key(s)" in results["foreign/other.ckpt"].detail
    assert results["notes.txt"].stage == "skipped" and results["notes.txt"].ok


def test_checkpoint_audit_reports_a_missing_model_module_per_file(checkpoint_dir, device, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "rmsnorm_kernel.model", None)  # makes the import fail
    results = [r for r in checks.audit_checkpoints(checkpoint_dir, device=device) if r.file.endswith("last.ckpt")]
    assert len(results) == 1
    assert results[0].stage == "rebuild" and not results[0].ok
    assert "rmsnorm_kernel.model.build_network is not importable" in results[0].detail


def test_checkpoint_audit_with_the_projects_build_network(tmp_path, device):
    model = pytest.importorskip("rmsnorm_kernel.model")
    write_checkpoint(tmp_path / "run" / "a.ckpt", device, builder=model.build_network)
    (result,) = checks.audit_checkpoints(tmp_path, device=device)
    assert result.ok, result.detail


def test_checkpoint_audit_of_a_missing_directory_is_empty(tmp_path):
    assert checks.audit_checkpoints(tmp_path / "nowhere", build_network) == []


# --------------------------------------------------------------------------------------------------
# clean


def make_project(root: Path, name: str = "rmsnorm_kernel") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    for d in ("outputs/hydra", "runs/triton_seed0", "checkpoints/triton_seed0", "multirun", ".pytest_cache",
              "src/pkg/__pycache__", "tests/__pycache__", ".venv/lib/__pycache__", "venv2/lib/__pycache__", "conf"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "venv2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "runs" / "triton_seed0" / "events.out.tfevents.1").write_text("x")
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    (root / "conf" / "config.yaml").write_text("seed: 0\n")
    return root


GENERATED = {"outputs", "runs", "checkpoints", "multirun", ".pytest_cache", "src/pkg/__pycache__", "tests/__pycache__"}
KEPT = {"pyproject.toml", "src/pkg/mod.py", "conf/config.yaml", ".venv/lib/__pycache__", "venv2/lib/__pycache__"}


def test_clean_dry_run_lists_the_generated_directories_and_removes_nothing(tmp_path):
    root = make_project(tmp_path / "proj")
    removals = housekeeping.clean_generated(root, dry_run=True)
    listed = {Path(r.path).relative_to(root.resolve()).as_posix() for r in removals if r.action == "would remove"}
    assert listed == GENERATED
    assert all((root / p).exists() for p in GENERATED | KEPT)


def test_clean_removes_exactly_the_generated_directories(tmp_path):
    root = make_project(tmp_path / "proj")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    (root / "outputs").rename(root / "outputs_real")
    (root / "outputs").symlink_to(outside, target_is_directory=True)
    removals = housekeeping.clean_generated(root, dry_run=False)
    assert not any((root / p).exists() for p in GENERATED - {"outputs"})
    assert all((root / p).exists() for p in KEPT)
    assert (outside / "keep.txt").read_text() == "precious"  # a linked outputs/ is not followed
    assert any(r.action.startswith("skipped: symbolic link") for r in removals)


@pytest.mark.parametrize("pyproject", [None, "other_project"])
def test_clean_refuses_outside_this_project(tmp_path, pyproject):
    root = make_project(tmp_path / "proj", name=pyproject or "x")
    if pyproject is None:
        (root / "pyproject.toml").unlink()
    with pytest.raises(housekeeping.NotTheProject, match="accepted: the root of the rmsnorm_kernel project"):
        housekeeping.clean_generated(root, dry_run=False)
    assert all((root / p).exists() for p in GENERATED)
