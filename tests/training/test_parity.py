"""Parity in this process: every RMSNorm path from the module's current weights against the reference, layer
by layer, at step 0 and every K steps, driven by a stand-in trainer; its verdicts through a checkpoint."""

from types import SimpleNamespace

import pytest
import torch

from rmsnorm_kernel.ops import launchers
from rmsnorm_kernel.ops import module as norm_module
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.tolerances import TOLERANCES
from rmsnorm_kernel.training.model import RMSNormRegressor
from rmsnorm_kernel.training.parity import COMPARED, Parity, ParityError, PathVerdict
from rmsnorm_kernel.training.verdicts import failed_checks
from tests.helpers import DEVICE

from .helpers import block_mean_forward


class Logger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))


class Strategy:
    """One process: reduce returns its input, unless told what the other processes' values were, the same
    for every compared path: their worst ratio to the tolerance, or [that ratio, their output difference,
    their gradient difference]; their norm layers' ratios are 0."""

    def __init__(self, others=None):
        self.others = others

    def reduce(self, t, reduce_op):
        assert reduce_op == "max"
        if self.others is None:
            return t
        others = self.others if isinstance(self.others, list) else [self.others, 0.0, 0.0]
        others = others + [0.0] * (len(t) // len(COMPARED) - len(others))
        return torch.maximum(t, torch.tensor(others * len(COMPARED), dtype=t.dtype, device=t.device))


def trainer_at(step, others=None, logger=True):
    return SimpleNamespace(global_step=step, logger=Logger() if logger else None, strategy=Strategy(others))


def module_and_batch(hidden_dim=257):
    torch.manual_seed(0)
    module = RMSNormRegressor(input_dim=16, hidden_dim=hidden_dim, output_dim=4, norm_impl="triton", eps=1e-6, lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    return module.to(DEVICE), (x.to(DEVICE), y.to(DEVICE))


def measure(step=0, parity=None, others=None):
    parity = parity if parity is not None else Parity(every_n_steps=25)
    module, batch = module_and_batch()
    trainer = trainer_at(step, others)
    parity.on_train_batch_start(trainer, module, batch, 0)
    return parity, trainer.logger.logged, module, batch


def test_the_paths_agree_at_step_0_and_the_errors_and_parity_calls_are_logged_there():
    parity, logged, module, (x, _) = measure()
    assert COMPARED == ("triton", "native")  # every path but the reference, the oracle
    assert parity.dtype == torch.float32 and parity.checked_steps == [0]
    tol = TOLERANCES[torch.float32]
    with torch.no_grad():
        scale = float(module.net(x).abs().max())
    [(step, metrics)] = logged
    assert step == 0
    for path, prefix in (("triton", "parity/"), ("native", "parity/native_")):
        verdict = parity.paths[path]
        assert verdict.ok and verdict.failed_steps == [], path
        assert 0.0 <= verdict.output_err <= tol.atol + tol.rtol * scale, path
        assert 0.0 <= verdict.grad_err < 1.0, path  # each gradient also passed compare(); this bounds the report
        assert metrics[f"{prefix}initial_output_err"] == metrics[f"{prefix}output_err"] == verdict.output_err
        assert metrics[f"{prefix}initial_grad_err"] == metrics[f"{prefix}grad_err"] == verdict.grad_err
        assert metrics[f"{prefix}worst_over_tol"] == verdict.worst_over_tol and 0.0 <= verdict.worst_over_tol <= 1.0
    # one Triton forward and one backward (the Triton copy of the network), counted apart from training
    assert (metrics["calls/parity_forward"], metrics["calls/parity_backward"]) == (1.0, 1.0)
    assert (module.calls["parity/forward"], module.calls["parity/backward"]) == (1, 1)
    assert module.calls["train/forward"] == module.calls["train/backward"] == 0


def test_a_wrong_kernel_fails_initial_parity_without_stopping_the_run(monkeypatch):
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    parity, logged, _, _ = measure()
    assert not parity.paths["triton"].ok and parity.paths["triton"].failed_steps == [0]
    assert parity.paths["triton"].output_err > 0.1  # the means are about half what they should be
    assert logged[0][1]["parity/worst_over_tol"] > 1.0
    assert parity.paths["native"].ok and logged[0][1]["parity/native_worst_over_tol"] <= 1.0  # the verdict is per path


def one_percent_off_native(monkeypatch):
    """``F.rms_norm`` as the native path calls it, every output 1% too large."""
    real = norm_module.F.rms_norm
    monkeypatch.setattr(norm_module.F, "rms_norm", lambda *args: real(*args) * 1.01)


def test_a_native_path_off_the_reference_fails_initial_parity_naming_it(monkeypatch):
    one_percent_off_native(monkeypatch)
    parity, logged, _, _ = measure()
    assert parity.paths["triton"].ok and not parity.paths["native"].ok
    assert logged[0][1]["parity/native_worst_over_tol"] > 1.0 >= logged[0][1]["parity/worst_over_tol"]
    cfg = SimpleNamespace(norm=SimpleNamespace(impl="native"))
    result = SimpleNamespace(
        calls={"train/forward": 0, "train/backward": 0, "train/fallback": 0}, steps=1, norm_calls_per_step=1
    )
    [line] = failed_checks(cfg, result, parity, 0.0, "native")
    assert line.startswith("initial parity: native outputs differ from the reference by ")
    assert line.endswith(", beyond the float32 tolerance (atol 1e-05, rtol 0.0001)")


def test_a_native_path_off_the_reference_along_the_run_stops_it_naming_the_path(monkeypatch):
    one_percent_off_native(monkeypatch)
    with pytest.raises(
        ParityError,
        match=r"^parity at step 50: the native and reference paths differ by [^;]* times the float32 tolerance "
        r"\(atol 1e-05, rtol 0.0001\), worst at the norm layer norm \([^)]*\), "
        r"before that step changed any weight$",
    ):
        measure(step=50)


def test_a_wrong_kernel_along_the_run_stops_it_naming_the_step(monkeypatch):
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    module, batch = module_and_batch()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = trainer_at(50)
    with pytest.raises(
        ParityError,
        match=r"^parity at step 50: the triton and reference paths differ by .* times the "
        r"float32 tolerance \(atol 1e-05, rtol 0.0001\), worst at the norm layer norm "
        r"\([^)]*\), before that step changed any weight$",
    ):
        Parity(every_n_steps=25).on_train_batch_start(trainer, module, batch, 0)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert trainer.logger.logged[0][0] == 50  # the curve has the bad point before the run stops


def test_the_initial_check_also_takes_the_worst_over_every_process():
    parity, logged, _, _ = measure(step=0, others=3.0)  # another process's rows disagree at step 0
    assert not parity.paths["triton"].ok and logged[0][1]["parity/worst_over_tol"] == 3.0  # an end check: no stop


def test_the_verdict_is_the_worst_over_every_process():
    # this process agrees; another one reported 3 times the tolerance: every process stops
    with pytest.raises(ParityError, match="^parity at step 25: .* 3 times the float32 tolerance"):
        measure(step=25, others=3.0)
    parity, _, _, _ = measure(step=25, others=0.5)
    assert [parity.paths[path].worst_over_tol for path in COMPARED] == [0.5, 0.5]


def test_under_data_parallelism_the_reported_differences_are_the_largest_over_every_process():
    # docs/resume-and-faults.md, "Numbers under data parallelism": the summary's parity numbers are global
    parity, logged, _, _ = measure(step=0, others=[0.5, 0.25, 0.125])  # another process's rows differ more
    metrics = logged[0][1]
    for path, prefix in (("triton", "parity/"), ("native", "parity/native_")):
        verdict = parity.paths[path]
        assert verdict.ok and (verdict.worst_over_tol, verdict.output_err, verdict.grad_err) == (0.5, 0.25, 0.125)
        assert (metrics[f"{prefix}output_err"], metrics[f"{prefix}grad_err"]) == (0.25, 0.125)
        assert (metrics[f"{prefix}initial_output_err"], metrics[f"{prefix}initial_grad_err"]) == (0.25, 0.125)


def test_the_verdicts_round_trip_through_a_checkpoint_read_with_weights_only(tmp_path, monkeypatch):
    # docs/resume-and-faults.md, "Verdicts across a resume"
    monkeypatch.setattr(launchers, "rmsnorm_forward", block_mean_forward)
    parity, _, _, _ = measure()
    assert not parity.paths["triton"].ok and parity.paths["triton"].failed_steps == [0]
    assert parity.paths["native"].ok and parity.paths["native"].output_err is not None
    torch.save({"callbacks": {parity.state_key: parity.state_dict()}}, tmp_path / "c.ckpt")
    state = torch.load(tmp_path / "c.ckpt", weights_only=True)["callbacks"]["Parity"]
    resumed = Parity(every_n_steps=25)
    resumed.load_state_dict(state)
    resumed.on_train_start(trainer_at(7), None)  # Lightning restores the callbacks before training starts
    for name in ("dtype", "skipped", "checked_steps"):
        assert getattr(resumed, name) == getattr(parity, name), name
    assert resumed.paths == parity.paths  # every path's numbers and verdicts, unknown_before None
    assert resumed.state_dict() == parity.state_dict()


#: ``Parity.state_dict`` as checkpoints held it before the native path was compared: the kernel's alone.
STATE_WITHOUT_NATIVE = {
    "output_err": 2.5e-07,
    "grad_err": 7.5e-09,
    "dtype": "float32",
    "ok": False,
    "skipped": None,
    "checked_steps": [0, 2],
    "failed_steps": [0],
    "worst_over_tol": 3.0,
    "unknown_before": None,
}


STATE_WITHOUT_NATIVE = {
    "output_err": 2.5e-07,
    "grad_err": 7.5e-09,
    "dtype": "float32",
    "ok": False,
    "skipped": None,
    "checked_steps": [0, 2],
    "failed_steps": [0],
    "worst_over_tol": 3.0,
    "unknown_before": None,
}


def test_a_checkpoint_without_native_verdicts_loads_and_leaves_native_unknown_before_the_resume():
    parity = Parity(every_n_steps=2)
    parity.load_state_dict(dict(STATE_WITHOUT_NATIVE))
    parity.on_train_start(trainer_at(3), None)
    kernel = PathVerdict(output_err=2.5e-07, grad_err=7.5e-09, ok=False, failed_steps=[0], worst_over_tol=3.0)
    assert parity.paths == {"triton": kernel, "native": PathVerdict(unknown_before=3)}
    assert (parity.dtype, parity.checked_steps) == (torch.float32, [0, 2])
    state = parity.state_dict()  # its own checkpoints carry the native keys now, and say what is unknown
    assert {k: state[k] for k in STATE_WITHOUT_NATIVE} == STATE_WITHOUT_NATIVE
    assert (state["native_ok"], state["native_output_err"], state["native_unknown_before"]) == (True, None, 3)
    cfg = SimpleNamespace(norm=SimpleNamespace(impl="native"))
    result = SimpleNamespace(
        calls={"train/forward": 0, "train/backward": 0, "train/fallback": 0}, steps=4, norm_calls_per_step=1
    )
    assert failed_checks(cfg, result, parity, 0.0, "native") == [
        "initial parity: unknown: this run resumed at step 3 from a checkpoint that carries no parity verdicts of "
        "native, so the checks of the steps before it were not seen",
        "initial parity: triton outputs differ from the reference by 2.5e-07, gradients by 7.5e-09, beyond the "
        "float32 tolerance (atol 1e-05, rtol 0.0001)",
    ]


@pytest.mark.parametrize(("step", "unknown_before"), [(0, None), (7, 7)])
def test_a_run_resumed_without_verdicts_knows_that_it_does_not_know_them(step, unknown_before):
    parity = Parity(every_n_steps=25)
    parity.on_train_start(trainer_at(step), None)  # nothing loaded: a fresh run at 0, an old checkpoint past 0
    assert [parity.paths[path].unknown_before for path in COMPARED] == [unknown_before, unknown_before]
    state = parity.state_dict()  # and its own checkpoints say so
    assert (state["unknown_before"], state["native_unknown_before"]) == (unknown_before, unknown_before)


def _agreeing(module, x, y):
    with torch.no_grad():
        out = module.net(x)
    results = {"y": out, "dx": torch.zeros_like(x), "dweight": torch.zeros_like(module.net.norm.weight)}
    return {"norm": dict.fromkeys(IMPLS, results)}


@pytest.mark.parametrize(
    ("every", "steps", "checked"),
    [
        (25, [0, 1, 10, 25, 26, 50], [0, 25, 50]),
        (0, [0, 1, 25, 50], [0]),  # 0: the initial check alone
        (25, [5, 24, 25, 75], [25, 75]),  # a run resumed at step 5: no initial check, the periodic ones
        (3, [0, 0, 3, 3], [0, 3]),  # a step started twice (a restarted epoch loop) is checked once
    ],
)
def test_it_checks_at_step_0_and_every_k_steps(every, steps, checked, monkeypatch):
    seen = []
    monkeypatch.setattr(Parity, "_every_layer", staticmethod(lambda m, x, y: seen.append(None) or _agreeing(m, x, y)))
    parity = Parity(every_n_steps=every)
    module, batch = module_and_batch()
    for step in steps:
        parity.on_train_batch_start(trainer_at(step, logger=False), module, batch, 0)
    assert parity.checked_steps == checked and len(seen) == len(checked)


def test_a_refused_shape_is_skipped_with_the_contract_reason_and_not_checked_again(monkeypatch):
    from rmsnorm_kernel.ops.contract import ContractError

    def refuse(module, x, y):
        raise ContractError("rmsnorm (triton): x has rows of N = 70000 elements; accepted: N <= 65536")

    monkeypatch.setattr(Parity, "_every_layer", staticmethod(refuse))
    parity = Parity(every_n_steps=1)
    module, batch = module_and_batch()
    for step in (0, 1, 2):
        parity.on_train_batch_start(trainer_at(step, logger=False), module, batch, 0)
    assert (
        parity.skipped == "the Triton contract refuses this shape "
        "(rmsnorm (triton): x has rows of N = 70000 elements; accepted: N <= 65536)"
    )
    assert parity.checked_steps == [] and all(
        v.ok for v in parity.paths.values()
    )  # nothing compared, nothing to report


@pytest.mark.parametrize("norm_impl", IMPLS)
def test_the_module_keeps_its_own_path_and_weights(norm_impl):
    module, batch = module_and_batch()
    module.net.norm.impl = norm_impl
    before = {k: v.clone() for k, v in module.state_dict().items()}
    Parity(every_n_steps=1).on_train_batch_start(trainer_at(1, logger=False), module, batch, 0)
    assert module.net.norm.impl == norm_impl
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())


@pytest.mark.parametrize("output", ["y", "h"])
def test_a_fused_residual_add_off_in_one_output_stops_the_run_naming_a_fused_layer(monkeypatch, output):
    # the Triton path's fused add and norm, with y or h = x + residual 1% off; the unfused first norm and
    # the reference and native paths are untouched
    fused = norm_module.rmsnorm

    def one_percent_off(*args, residual=None, **kwargs):
        out = fused(*args, residual=residual, **kwargs)
        if residual is None:
            return out
        y, h = out
        return (y * 1.01, h) if output == "y" else (y, h * 1.01)

    monkeypatch.setattr(norm_module, "rmsnorm", one_percent_off)
    torch.manual_seed(0)
    lm = dict(dim=16, layers=1, heads=2, mlp_hidden=32, seq_len=8, qk_norm=False)
    module = RMSNormRegressor(None, None, None, "triton", 1e-6, 1e-3, kind="transformer", **lm).to(DEVICE)
    tokens = torch.randint(0, 256, (2, 9), device=DEVICE)
    with pytest.raises(ParityError, match=r"^parity at step 50: the triton and reference paths differ") as stop:
        Parity(every_n_steps=25).on_train_batch_start(trainer_at(50), module, (tokens[:, :-1], tokens[:, 1:]), 0)
    layer = str(stop.value).split("worst at the norm layer ")[1].split(" ")[0]
    assert layer in {"blocks.0.mlp_norm", "final_norm"}  # the two norms with a residual
