"""The run's callbacks in this process: Parity (every RMSNorm path from the module's current weights against
the reference, at step 0 and every K steps), ValidateAtLastStep, StepTimer and StepCheckpoints, driven by a
stand-in trainer."""

import logging
import re
import signal
from types import SimpleNamespace

import pytest
import torch

from rmsnorm_kernel.ops import kernels
from rmsnorm_kernel.ops import module as norm_module
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.ops.tolerances import TOLERANCES
from rmsnorm_kernel.training import callbacks
from rmsnorm_kernel.training.callbacks import (
    COMPARED,
    Parity,
    ParityError,
    PathVerdict,
    StepCheckpoints,
    StepTimer,
    ValidateAtLastStep,
)
from rmsnorm_kernel.training.model import RMSNormRegressor
from rmsnorm_kernel.training.run import failed_checks
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
    monkeypatch.setattr(kernels, "rmsnorm_forward", block_mean_forward)
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
    monkeypatch.setattr(kernels, "rmsnorm_forward", block_mean_forward)
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
    monkeypatch.setattr(kernels, "rmsnorm_forward", block_mean_forward)
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


def test_a_checkpoint_without_call_counts_leaves_the_earlier_counts_unknown():
    module, _ = module_and_batch()
    module.on_load_checkpoint({"global_step": 5})
    assert module.calls_unknown_before == 5 and module.calls["train/forward"] == 0
    saved = {}
    module.on_save_checkpoint(saved)
    assert saved["calls_unknown_before"] == 5  # carried on: a later resume still knows
    fresh, _ = module_and_batch()
    fresh.on_load_checkpoint({"global_step": 5, "calls": {**module.calls, "train/forward": 5}})
    assert fresh.calls_unknown_before is None and fresh.calls["train/forward"] == 5


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


def _agreeing(module, x, y):
    with torch.no_grad():
        out = module.net(x)
    results = {"y": out, "dx": torch.zeros_like(x), "dweight": torch.zeros_like(module.net.norm.weight)}
    return {"norm": dict.fromkeys(IMPLS, results)}


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


@pytest.mark.parametrize(("global_step", "stops"), [(3, False), (4, True)])
def test_the_last_step_asks_lightning_to_stop_and_so_to_validate(global_step, stops):
    trainer = SimpleNamespace(global_step=global_step, max_steps=4, should_stop=False)
    ValidateAtLastStep().on_train_batch_end(trainer, None, None, None, 0)
    assert trainer.should_stop is stops


def test_the_step_timer_logs_each_windows_median_and_the_last_partial_window(monkeypatch):
    clock = iter([0.0, 0.001, 1.0, 1.003, 2.0, 2.002, 3.0, 3.010, 4.0, 4.004])  # steps of 1, 3, 2, 10, 4 ms
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    timer, logger = StepTimer(), Logger()
    module = SimpleNamespace(device=torch.device("cpu"))
    for step in range(5):
        timer.on_train_batch_start(None, module, None, step)
        trainer = SimpleNamespace(global_step=step + 1, max_steps=5, log_every_n_steps=2, logger=logger)
        timer.on_train_batch_end(trainer, module, None, None, step)
    # windows of 2 steps: (1, 3) -> 2, (2, 10) -> 6, then the run's last step alone -> 4; at the steps
    # train/mse uses (0-based: the window's last step)
    assert [(s, round(m["time/step_ms"], 6)) for s, m in logger.logged] == [(1, 2.0), (3, 6.0), (4, 4.0)]
    assert [round(m, 6) for m in timer.medians] == [2.0, 6.0, 4.0]


def test_on_a_signal_last_ckpt_is_named_in_process_0s_folder(tmp_path):
    # on another process the folder this process guessed may differ; Lightning hands every process
    # process 0's folder through the checkpoint callback
    from rmsnorm_kernel.training.callbacks import SaveOnSignal

    saved = []
    trainer = SimpleNamespace(
        received_sigterm=True,
        global_step=7,
        checkpoint_callback=SimpleNamespace(dirpath=str(tmp_path / "version_0")),
        save_checkpoint=lambda path, weights_only: saved.append(path),
    )
    on_signal = SaveOnSignal(tmp_path / "version_1")
    on_signal.on_exception(trainer, None, RuntimeError())
    assert saved == [tmp_path / "version_0" / "last.ckpt"] and (on_signal.saved, on_signal.step) == (saved[0], 7)


class CheckpointTrainer(SimpleNamespace):
    """A stand-in trainer for StepCheckpoints: one process, validation every ``val_check_interval`` steps;
    it records each checkpoint written with the step and the validations run by then."""

    def __init__(self, folder):
        from lightning.pytorch.trainer.states import TrainerFn

        super().__init__(
            state=SimpleNamespace(fn=TrainerFn.FITTING),
            sanity_checking=False,
            enable_validation=True,
            val_check_interval=3,
            should_stop=False,
            global_step=0,
            strategy=SimpleNamespace(broadcast=lambda obj: obj),
            validated=[],
            saved=[],
        )
        self.folder = folder

    def save_checkpoint(self, path, weights_only):
        assert weights_only is False
        self.saved.append((path.name, self.global_step, list(self.validated)))
        path.write_bytes(b"")

    def step(self, callback, stop_later=False):
        """One training step's hooks, then its validation if Lightning would run one."""
        self.global_step += 1
        callback.on_train_batch_end(self, None, None, None, 0)
        self.should_stop = self.should_stop or stop_later  # asked after the checkpoint callback's hook
        if self.global_step % self.val_check_interval == 0 or self.should_stop:
            self.validated.append(self.global_step)
            callback.on_validation_end(self, None)


def test_a_validation_steps_checkpoint_is_written_after_its_validation(tmp_path):
    trainer = CheckpointTrainer(tmp_path)  # validation every 3 steps
    callback = StepCheckpoints(tmp_path, every_n_steps=2)
    callback.setup(trainer, None, "fit")
    trainer.sanity_checking = True
    callback.on_validation_end(trainer, None)  # the sanity check writes nothing
    trainer.sanity_checking = False
    (tmp_path / "step00004.ckpt").write_bytes(b"another run's")  # never replaced
    for _ in range(7):
        trainer.step(callback)
    trainer.should_stop = True  # asked at the last step (ValidateAtLastStep): Lightning validates it
    trainer.step(callback)
    trainer.should_stop = False
    trainer.step(callback)
    trainer.step(callback, stop_later=True)  # a stop asked after the step's files were written
    assert trainer.saved == [
        ("step00002.ckpt", 2, []),  # not a validation step: at its end
        ("last.ckpt", 2, []),
        ("step00004-v1.ckpt", 4, [3]),
        ("last.ckpt", 4, [3]),
        ("step00006.ckpt", 6, [3, 6]),  # after its validation
        ("last.ckpt", 6, [3, 6]),
        ("step00008.ckpt", 8, [3, 6, 8]),
        ("last.ckpt", 8, [3, 6, 8]),
        ("step00010.ckpt", 10, [3, 6, 8, 9]),
        ("last.ckpt", 10, [3, 6, 8, 9]),
        ("step00010.ckpt", 10, [3, 6, 8, 9, 10]),  # written again, with its validation
        ("last.ckpt", 10, [3, 6, 8, 9, 10]),
    ]
    assert (tmp_path / "step00004.ckpt").read_bytes() == b"another run's"
    names = ("step00002.ckpt", "step00004-v1.ckpt", "step00006.ckpt", "step00008.ckpt", "step00010.ckpt")
    assert callback.written == [tmp_path / name for name in names]


class TickEvent:
    """A stand-in for ``torch.cuda.Event`` on the CPU: each ``record`` takes the next tick of one clock, and
    every event recorded is kept, so that a test can see the order of the timer's edges."""

    clock = 0

    def __init__(self, enable_timing=False):
        self.tick = None

    def record(self):
        TickEvent.clock += 1
        self.tick = TickEvent.clock

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return float(end.tick - self.tick)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_the_step_timer_times_every_norm_of_the_language_model_apart_forward_and_backward(monkeypatch, impl):
    from rmsnorm_kernel.training.network import build_network, norm_layers

    monkeypatch.setattr(callbacks.torch.cuda, "Event", TickEvent)
    torch.manual_seed(0)
    # two blocks with q/k norm: 9 norms, fused residual adds with two inputs and two outputs each
    net = build_network(
        None,
        None,
        None,
        impl,
        1e-6,
        kind="transformer",
        dim=16,
        layers=2,
        heads=2,
        mlp_hidden=32,
        seq_len=8,
        qk_norm=True,
    ).to(DEVICE)  # where the kernels run; the events are stand-ins either way
    module = SimpleNamespace(device=SimpleNamespace(type="cuda"), net=net)  # the timer hooks on a GPU only
    timer, logger = StepTimer(norm_events=True), Logger()
    timer.on_train_start(None, module)
    timer.on_train_batch_start(None, module, None, 0)
    net(torch.randint(0, 256, (2, 8), device=DEVICE)).float().square().mean().backward()
    events = timer._events
    trainer = SimpleNamespace(global_step=1, max_steps=1, log_every_n_steps=1, logger=logger)
    timer.on_train_batch_end(trainer, module, None, None, 0)
    timer.on_train_end(None, module)

    names = [name for name, _ in norm_layers(net)]
    assert len(names) == 9 and sorted(events) == sorted(names)
    spans = {}
    for name in names:
        e = {edge: events[name][edge].tick for edge in callbacks.EDGES}
        assert e["forward_start"] < e["forward_end"] < e["backward_start"] < e["backward_end"], name
        spans[name] = e
    # each layer's backward holds no other layer's: its start waits for every output's gradient (an
    # attention norm's y gets its gradient after the q/k norms' backward)
    backward = sorted((s["backward_start"], s["backward_end"]) for s in spans.values())
    assert all(end < next_start for (_, end), (next_start, _) in zip(backward, backward[1:]))
    # each layer's forward and backward hold no other event: one tick each, 2 x 9 in all
    ((_, metrics),) = logger.logged
    assert metrics["time/rmsnorm_ms"] == 18.0 < metrics["time/step_ms"]
    assert not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for _, m in norm_layers(net)
    )


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_lightnings_announcement_of_a_stop_names_the_signal_that_came(tmp_path, monkeypatch, signum):
    from .helpers import main, signal_after_step

    class Messages(logging.Handler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def emit(self, record):
            self.seen.append(record.getMessage())

    handler, log = Messages(), logging.getLogger(callbacks.LIGHTNING_SIGNAL_LOGGER)
    log.addHandler(handler)
    signal_after_step(monkeypatch, 2, signum)
    try:
        with pytest.raises(SystemExit):
            main(tmp_path, "norm=reference")
    finally:
        log.removeHandler(handler)
    expected = {signal.SIGINT: "Received SIGINT: 2", signal.SIGTERM: "Received SIGTERM: 15"}[signum]
    assert [m.removeprefix("[rank: 0] ") for m in handler.seen if "Received" in m] == [expected]


def test_the_progress_bar_counts_steps_of_max_steps_in_the_datas_epoch_also_after_a_resume(tmp_path, capsys):
    from .helpers import train

    bar = re.compile(r"Epoch (-?\d+)(?:/-?\d+)?: +\d+%\|[^|]*\| (\d+)/(\d+)")
    shown = []
    for steps, resume in ((6, []), (8, ["ckpt_path=last"])):  # 4 batches an epoch; the second from step 6
        train(tmp_path, "norm=reference", f"trainer.max_steps={steps}", "trainer.enable_progress_bar=true", *resume)
        text = capsys.readouterr().out
        assert "/-" not in text
        shown.append([(int(e), int(n), int(t)) for e, n, t in bar.findall(text)])
    straight, resumed = shown
    assert {t for _, _, t in straight} == {6} and {t for _, _, t in resumed} == {8}
    assert (0, 4, 6) in straight and straight[-1] == (1, 6, 6)
    assert resumed[0][:2] == (1, 6) and resumed[-1] == (1, 8, 8)
    assert all(n <= t for _, n, t in straight + resumed)
