"""One training run from a composed configuration, the checks that end it, and the two-path summary.

``run(cfg)`` trains the network with the RMSNorm path that ``cfg.norm.impl`` names and then checks:

- initial parity: on the first batch, from the same weights, both paths give the same outputs and
  gradients within the float32 tolerance of ``tolerances.py``;
- integration: the Triton path's wrappers ran once forward and once backward per training step (and
  the reference path never called them);
- reload parity: the final checkpoint, loaded into a fresh module, gives bit-identical test outputs and
  the same RMSNorm path.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback as HydraCallback
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard.summary import hparams as hparams_summary

from ..ops.backend import backend
from .checkpoints import AtomicCheckpointIO, CheckpointError, check_matches, read_checkpoint, remove_stale_temporaries
from .config import ConfigError, validate
from ..ops.contract import ContractError
from .data import SyntheticRegressionData
from .events import read_scalars
from .model import NonFiniteLossError, RMSNormRegressor, build_network
from ..ops.module import IMPLS
from ..ops.tolerances import compare



@dataclass
class RunResult:
    name: str
    impl: str
    seed: int
    backend: str
    steps: int = 0
    log_dir: str = ""
    checkpoint: str = ""
    initial_weights_sha256: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def project_path(path: str) -> Path:
    """A configured path, relative to where the command was started."""
    base = Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()
    return (base / path).resolve()


def run_name(cfg: DictConfig) -> str:
    return f"{cfg.norm.impl}_seed{cfg.seed}"


def state_dict_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build(cfg: DictConfig) -> tuple[RMSNormRegressor, SyntheticRegressionData]:
    """Seed once, then build the module and the data: the same seed gives the same weights on both paths."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = RMSNormRegressor(
        input_dim=cfg.model.input_dim,
        hidden_dim=cfg.model.hidden_dim,
        output_dim=cfg.model.output_dim,
        norm_impl=cfg.norm.impl,
        eps=cfg.norm.eps,
        lr=cfg.model.lr,
        norm_fallback=cfg.norm.fallback,
    )
    data = SyntheticRegressionData(
        input_dim=cfg.model.input_dim,
        output_dim=cfg.model.output_dim,
        batch_size=cfg.data.batch_size,
        train_size=cfg.data.train_size,
        val_size=cfg.data.val_size,
        test_size=cfg.data.test_size,
        noise=cfg.data.noise,
        seed=cfg.data.seed,
        shuffle_seed=cfg.seed,
    )
    return module, data


class InitialParity(L.Callback):
    """On the first training batch, runs both paths from the module's initial weights and compares them."""

    def __init__(self) -> None:
        self.output_err: float | None = None
        self.grad_err: float | None = None
        self.ok = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != 0 or self.output_err is not None:
            return
        x, y = batch
        outs, grads = {}, {}
        for impl in IMPLS:
            net = build_network(**{**pl_module.network_kwargs(), "norm_impl": impl}).to(x.device)
            net.load_state_dict(pl_module.net.state_dict())
            out = net(x)
            grads[impl] = torch.autograd.grad(F.mse_loss(out, y), list(net.parameters()))
            outs[impl] = out.detach()
        self.output_err = float((outs["triton"] - outs["reference"]).abs().max())
        self.grad_err = max(float((a - b).abs().max()) for a, b in zip(grads["triton"], grads["reference"]))
        self.ok = compare(outs["triton"], outs["reference"]).ok and all(
            compare(a, b).ok for a, b in zip(grads["triton"], grads["reference"])
        )
        if trainer.logger is not None:
            trainer.logger.log_metrics(
                {"parity/initial_output_err": self.output_err, "parity/initial_grad_err": self.grad_err}, step=0
            )


def reload_max_abs_diff(
    module: RMSNormRegressor, checkpoint: Path, data: SyntheticRegressionData, device: torch.device
) -> tuple[float, str]:
    """Loads the checkpoint into a fresh module and runs the test split through both on ``device``.

    Returns the largest absolute difference of their outputs and the RMSNorm path the fresh module got.
    """
    module.to(device)  # Lightning hands the module back on the CPU after fit and test
    fresh = RMSNormRegressor.load_from_checkpoint(checkpoint, map_location=device, weights_only=True)
    module.eval()
    fresh.eval()
    worst = 0.0
    with torch.no_grad():
        for x, _ in data.test_dataloader():
            x = x.to(device)
            # .forward, not __call__: the eager network on both sides, also when training ran compiled
            a, b = module.net.forward(x), fresh.net.forward(x)
            if not torch.equal(a, b):
                worst = max(worst, float((a - b).abs().max()) if a.shape == b.shape else float("inf"))
    return worst, fresh.hparams.norm_impl


def flat_hparams(cfg: DictConfig) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True)
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value)
            else:
                flat[name] = value if isinstance(value, (int, float, str, bool)) else str(value)

    walk("", container)
    return flat


@dataclass
class Resume:
    path: Path
    version: int | None  # the TensorBoard/checkpoint version of the run it continues, when known
    global_step: int


def resolve_resume(cfg: DictConfig, module: RMSNormRegressor, data: SyntheticRegressionData) -> Resume | None:
    """Finds and checks the checkpoint ``cfg.ckpt_path`` names, before anything is written.

    ``last`` is the newest ``last.ckpt`` of this run (same norm path and seed). The file must load with
    ``weights_only=True`` and hold this configuration's network, norm path and data.
    """
    if cfg.ckpt_path is None:
        return None
    run_dir = project_path(cfg.paths.checkpoints) / run_name(cfg)
    if cfg.ckpt_path == "last":
        candidates = sorted(run_dir.glob("version_*/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise CheckpointError(f"ckpt_path=last: {run_dir} holds no last.ckpt to resume from")
        path = candidates[-1]
    else:
        path = project_path(cfg.ckpt_path)
    ckpt = read_checkpoint(path)
    check_matches(path, ckpt, dict(module.hparams))
    data_hp = ckpt.get("datamodule_hyper_parameters")
    if data_hp is not None:
        check_matches(path, {"hyper_parameters": data_hp}, dict(data.hparams))
    version = None
    if path.parent.parent == run_dir and path.parent.name.startswith("version_"):
        version = int(path.parent.name.removeprefix("version_"))
    return Resume(path=path, version=version, global_step=int(ckpt["global_step"]))


def mark_restart(logger: TensorBoardLogger, step: int) -> None:
    """Tells TensorBoard that the run restarts at ``step``: values logged at later steps before the
    interruption are orphans and are dropped by its readers, so each step keeps one value."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer = logger.experiment._get_file_writer()
    writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
    writer.flush()


def run(cfg: DictConfig) -> RunResult:
    """Trains once as configured, runs the checks, and returns what happened (failures included)."""
    validate(cfg)
    # The splits are small tensors already in memory; worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    start = time.perf_counter()
    name = run_name(cfg)
    result = RunResult(name=name, impl=cfg.norm.impl, seed=cfg.seed, backend=backend())
    module, data = build(cfg)
    result.initial_weights_sha256 = state_dict_sha256(module)
    resume = resolve_resume(cfg, module, data)
    if cfg.compile:
        module.net.compile(fullgraph=True)  # in place: the state dict keeps its keys

    # A resumed run continues the run it came from: same TensorBoard folder, same checkpoint folder.
    version = resume.version if resume is not None else None
    logger = TensorBoardLogger(
        save_dir=str(project_path(cfg.paths.runs)), name=name, version=version, default_hp_metric=False
    )
    checkpoint_dir = project_path(cfg.paths.checkpoints) / name / f"version_{logger.version}"
    # Under data parallelism every process runs this function; process 0 alone writes files (Lightning
    # routes logging and checkpoint writing through it, and these lines follow the same rule).
    if rank_zero_only.rank == 0:
        remove_stale_temporaries(checkpoint_dir)
        if resume is not None:
            mark_restart(logger, resume.global_step)
    parity = InitialParity()
    checkpoints = ModelCheckpoint(
        dirpath=checkpoint_dir,
        filename="step{step:05d}",
        auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint.every_n_steps,
        save_top_k=-1,
        save_last=True,
    )
    trainer = L.Trainer(
        max_steps=cfg.trainer.max_steps,
        val_check_interval=cfg.trainer.val_check_interval,
        check_val_every_n_epoch=None,  # val_check_interval counts steps across epochs
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy,
        precision=cfg.trainer.precision,
        deterministic=cfg.trainer.deterministic,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        enable_model_summary=False,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[parity, checkpoints],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(checkpoint_dir),
    )
    try:
        trainer.fit(module, datamodule=data, ckpt_path=str(resume.path) if resume else None, weights_only=True)
    except NonFiniteLossError as e:
        saved = sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
        kept = f"the last good checkpoint is {saved[-1]}" if saved else "no checkpoint had been written yet"
        raise NonFiniteLossError(f"{e}; {kept}") from None
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}  # test() resets them
    final = checkpoint_dir / "final.ckpt"
    trainer.save_checkpoint(final, weights_only=False)  # the full state: optimizer and loops too
    # last.ckpt is what ckpt_path=last resumes: after a completed run, that is the final state.
    trainer.save_checkpoint(checkpoint_dir / "last.ckpt", weights_only=False)
    trainer.test(module, datamodule=data, verbose=False)

    result.steps = trainer.global_step
    result.log_dir = logger.log_dir
    result.checkpoint = str(final)
    result.calls = dict(module.calls)
    result.seconds = time.perf_counter() - start
    if not trainer.is_global_zero:
        return result  # the checks below read and write files: process 0 runs them, in one process
    diff, reloaded_impl = reload_max_abs_diff(module, final, data, trainer.strategy.root_device)
    logger.log_metrics({"reload/max_abs_diff": diff}, step=trainer.global_step)
    result.metrics = {
        "train/mse": fit_metrics["train/mse"],
        "val/mse": fit_metrics.get("val/mse", float("nan")),
        "test/mse": float(module.test_mse),
        "parity/initial_output_err": parity.output_err,
        "parity/initial_grad_err": parity.grad_err,
        "reload/max_abs_diff": diff,
    }
    write_hparams(logger, {**flat_hparams(cfg), "backend": backend()}, module.test_mse)

    if not parity.ok:
        result.failures.append(
            f"initial parity: outputs differ by {parity.output_err:.3g}, gradients by {parity.grad_err:.3g}, "
            "beyond the float32 tolerance (atol 1e-5, rtol 1e-4)"
        )
    # Every training step runs the Triton path once, unless the contract sent it to the reference
    # (norm.fallback=reference, counted); the reference path never runs it.
    expected = result.steps - result.calls["train/fallback"] if cfg.norm.impl == "triton" else 0
    for key in ("train/forward", "train/backward"):
        if result.calls[key] != expected:
            result.failures.append(
                f"integration: {result.calls[key]} Triton {key.split('/')[1]} calls in {result.steps} "
                f"training steps on the {cfg.norm.impl} path; expected {expected}"
            )
    if diff != 0.0:
        result.failures.append(f"reload parity: test outputs differ by {diff:.3g} after reloading {final} (must be 0)")
    if reloaded_impl != cfg.norm.impl:
        result.failures.append(f"reload parity: {final} reloaded with norm {reloaded_impl!r}, trained with {cfg.norm.impl!r}")
    result.seconds = time.perf_counter() - start
    return result


def write_hparams(logger: TensorBoardLogger, params: dict, test_mse: float) -> None:
    """The run's configuration in TensorBoard's HPARAMS tab, with test/mse (already logged) as its metric."""
    writer = logger.experiment._get_file_writer()
    for summary in hparams_summary(params, {"test/mse": test_mse}):
        writer.add_summary(summary)
    writer.flush()


def format_summary(r: RunResult) -> str:
    m = r.metrics
    lines = [
        f"run {r.name}: {'OK' if r.ok else 'FAILED'}",
        f"  path {r.impl}, backend {r.backend}, {r.steps} steps, {r.seconds:.1f} s",
        f"  mse: train {m.get('train/mse', float('nan')):.6f}, val {m.get('val/mse', float('nan')):.6f}, "
        f"test {m.get('test/mse', float('nan')):.6f}",
        f"  Triton calls: train forward {r.calls.get('train/forward')}, backward {r.calls.get('train/backward')}; "
        f"val forward {r.calls.get('val/forward')}, test forward {r.calls.get('test/forward')}; "
        f"training fallbacks to the reference {r.calls.get('train/fallback')} (counts of process 0)",
        (
            f"  initial parity: output {m['parity/initial_output_err']:.3g}, grad {m['parity/initial_grad_err']:.3g}"
            if m.get("parity/initial_output_err") is not None
            else "  initial parity: measured at step 0 by the run this one resumed"
        ),
        f"  reload parity: max |diff| {m.get('reload/max_abs_diff')} ({'bit-identical' if m.get('reload/max_abs_diff') == 0 else 'DIFFERENT'})",
        f"  logs: {r.log_dir}",
        f"  checkpoint: {r.checkpoint}",
    ]
    lines += [f"  check failed: {f}" for f in r.failures]
    return "\n".join(lines)


def main(cfg: DictConfig) -> RunResult:
    """The body of ``train.py``: one run; a failed check exits non-zero (at the end of a multirun)."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        result = run(cfg)
        if rank_zero_only.rank != 0:
            return result  # process 0 reports for all
    except ConfigError as e:
        print(f"train.py: configuration error: {e}", file=sys.stderr)
        sys.exit(2)
    except CheckpointError as e:
        print(f"train.py: checkpoint error: {e}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as e:
        print(f"train.py: training stopped: {e}", file=sys.stderr)
        sys.exit(1)
    except ContractError as e:
        print(f"train.py: training stopped: {e} (norm.fallback=reference sends such inputs to the reference)", file=sys.stderr)
        sys.exit(1)
    print(format_summary(result), flush=True)
    if not result.ok and not multirun:
        print(f"train.py: check failed: {result.failures[0]}", file=sys.stderr)
        sys.exit(1)
    return result


def last(scalars: dict, tag: str) -> float:
    return scalars[tag][-1][1] if scalars.get(tag) else float("nan")


class MultirunSummary(HydraCallback):
    """After ``train.py -m``, one table of all runs, read back from their TensorBoard event files."""

    def __init__(self) -> None:
        self.results: list[RunResult] = []
        self.crashed: list[str] = []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        try:
            self.results.append(job_return.return_value)
        except Exception as e:  # the job raised: keep going, report it at the end
            self.crashed.append(f"{job_return.overrides}: {type(e).__name__}: {e}")

    def on_multirun_end(self, config, **kwargs) -> None:
        rows = []
        for r in self.results:
            s = read_scalars(r.log_dir)
            rows.append(
                {
                    "run": r.name,
                    "backend": r.backend,
                    "steps": r.steps,
                    "train/mse": last(s, "train/mse"),
                    "val/mse": last(s, "val/mse"),
                    "test/mse": last(s, "test/mse"),
                    "calls/forward": last(s, "calls/forward"),
                    "calls/backward": last(s, "calls/backward"),
                    "parity/initial_output_err": last(s, "parity/initial_output_err"),
                    "parity/initial_grad_err": last(s, "parity/initial_grad_err"),
                    "reload/max_abs_diff": last(s, "reload/max_abs_diff"),
                    "initial_weights_sha256": r.initial_weights_sha256[:16],
                    "seconds": round(r.seconds, 1),
                    "ok": r.ok,
                    "log_dir": r.log_dir,
                }
            )
        table = summary_table(rows)
        print("\n" + table, flush=True)
        out_dir = project_path(config.paths.runs)
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        (out_dir / f"summary_{stamp}.md").write_text(table + "\n")
        (out_dir / f"summary_{stamp}.json").write_text(json.dumps({"runs": rows, "failures": [asdict(r)["failures"] for r in self.results], "crashed": self.crashed}, indent=2))
        print(f"summary written to {out_dir / f'summary_{stamp}.md'}", flush=True)
        failures = [f"{r.name}: {f}" for r in self.results for f in r.failures] + self.crashed
        if failures:
            print(f"train.py: check failed: {failures[0]}", file=sys.stderr)
            sys.exit(1)


def summary_table(rows: list[dict]) -> str:
    """Runs side by side, one column per run, with the test-MSE difference when there are two."""
    keys = [
        "backend", "steps", "train/mse", "val/mse", "test/mse", "calls/forward", "calls/backward",
        "parity/initial_output_err", "parity/initial_grad_err", "reload/max_abs_diff", "initial_weights_sha256",
        "seconds", "ok",
    ]

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    header = "| | " + " | ".join(r["run"] for r in rows) + " |"
    lines = [header, "|---" * (len(rows) + 1) + "|"]
    lines += ["| " + k + " | " + " | ".join(fmt(r[k]) for r in rows) + " |" for k in keys]
    if len(rows) == 2:
        lines.append(f"\ntest/mse difference ({rows[0]['run']} - {rows[1]['run']}): {rows[0]['test/mse'] - rows[1]['test/mse']:.3g}")
    return "\n".join(lines)
