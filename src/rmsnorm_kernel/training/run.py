"""One training run from a composed configuration, top to bottom: compose (``validate``), build (the
module, the data, the resume), fit, test, check (``verdicts.failed_checks``), summarise (HPARAMS and the
``RunResult`` that ``cli`` prints).

``run(cfg)`` trains the network of ``cfg.model.kind`` (the regression or the language model, ``network.py``)
with the RMSNorm path that ``cfg.norm.impl`` names. Before the model is built, the runs and checkpoint
folders are created and proved writable (``paths.prepare_folder``); a refusal before any work removes the
folders it created.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from ..ops.backend import backend
from ..ops.contract import ContractError
from ..ops.counters import counting
from ..signals import sigint_as_sigterm, sigterm_recorded
from .checkpoints import RunLock, remove_stale_temporaries
from .config import MODEL_KINDS, validate
from .data import SplitData, SyntheticRegressionData, TextData
from .events import read_scalars, write_layout
from .faults import OutputError, describe_write_failure, last_good_line, write_failure, writer_thread_errors_quiet
from .hparams import flat_hparams, write_hparams
from .model import RMSNormRegressor, TrainingStopped
from .network import LOSS_NAMES, network_copy, norm_calls_per_step, sharded
from .on_signal import Interrupted, SaveOnSignal
from .parity import Parity, parity_tag
from .paths import claim_version, prepare_folder, project_path, remove_folders, run_name
from .progress import StepProgressBar
from .result import RunResult, state_dict_sha256
from .resume import RecordIdentity, mark_branch, mark_restart, record_end, resolve_resume, run_identity
from .step_checkpoints import StepCheckpoints, ValidateAtLastStep
from .timing import StepTimer
from .trainer import check_precision, trainer_kwargs
from .verdicts import failed_checks, reload_max_abs_diff

__all__ = ["OutputError", "RunResult", "build", "process_zero", "run"]


def process_zero() -> bool:
    """Global process 0, asked before the Trainer exists (Lightning sets ``rank_zero_only.rank`` to the
    global rank when the Trainer is built; before that it holds the environment's RANK, LOCAL_RANK or
    SLURM_PROCID, and under Lightning's own launcher NODE_RANK alone names the machine)."""
    return rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))) == 0


def build(cfg: DictConfig) -> tuple[RMSNormRegressor, SplitData]:
    """Seed once, then build the module and the data: the same seed gives the same weights on every path."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    sizes = {key: cfg.model[key] for key in MODEL_KINDS[cfg.model.kind]}
    module = RMSNormRegressor(
        norm_impl=cfg.norm.impl,
        eps=cfg.norm.eps,
        lr=cfg.model.lr,
        norm_fallback=cfg.norm.fallback,
        dtype="bfloat16" if str(cfg.trainer.precision) == "bf16-true" else "float32",
        kind=cfg.model.kind,
        **{"input_dim": None, "hidden_dim": None, "output_dim": None, **sizes},
    )
    splits = dict(
        batch_size=cfg.data.batch_size,
        train_size=cfg.data.train_size,
        val_size=cfg.data.val_size,
        test_size=cfg.data.test_size,
        seed=cfg.data.seed,
        shuffle_seed=cfg.seed,
    )
    if cfg.model.kind == "transformer":
        return module, TextData(seq_len=cfg.model.seq_len, **splits)
    data = SyntheticRegressionData(
        input_dim=cfg.model.input_dim, output_dim=cfg.model.output_dim, noise=cfg.data.noise, **splits
    )
    return module, data


@counting()  # the integration check reads the Triton calls of every stage
def run(cfg: DictConfig, record: bool = True) -> RunResult:
    """Trains once as configured, runs the checks, and returns what happened (failures included). With
    ``record``, the run's end is recorded then (``resume.record_end``); ``train.py`` records it itself,
    once it has printed the summary.

    Raises ``ConfigError``, ``CheckpointError``, ``PathError`` (all before anything is written),
    ``checkpoints.RunInUse`` (another live process writes the run), ``NonFiniteLossError``,
    ``ContractError``, ``OutputError`` (a write refused: a full disk) and ``callbacks.Interrupted``
    (SIGTERM, SIGINT); ``cli.main`` turns each into one line and an exit code. Any other exception after
    set-up carries ``last_good`` (``last_good_line``) for that line.
    """
    validate(cfg)
    check_precision(cfg)
    # The splits are small tensors already in memory; worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    # The checkpoint folder holds the run's lock file from the start, and a resumed run's checkpoints.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # time/step_ms has its own window (trainer.log_every_n_steps), which may hold more steps than an epoch.
    warnings.filterwarnings("ignore", message=r"The number of training batches .* is smaller than the logging interval")
    start = time.perf_counter()
    name = run_name(cfg)
    result = RunResult(
        name=name,
        impl=cfg.norm.impl,
        seed=cfg.seed,
        backend=backend(),
        loss_name=LOSS_NAMES[cfg.model.kind],
        norm_calls_per_step=norm_calls_per_step(cfg.model.kind, cfg.model.layers, cfg.model.qk_norm),
    )
    created = []
    try:
        for key in ("runs", "checkpoints"):
            created += prepare_folder(f"paths.{key}", project_path(cfg.paths[key]))
        module, data = build(cfg)
        result.initial_weights_sha256 = state_dict_sha256(module)
        resume = resolve_resume(cfg, module, data)
    except BaseException:
        remove_folders(created)  # refused before any work: leave nothing behind
        raise
    if resume is not None and resume.done:
        remove_folders(created)
        result.failures = list(resume.failures or [])  # the verdict of its end, as recorded
        result.steps = resume.global_step
        result.checkpoint = str(resume.path)
        result.log_dir = str(resume.log_dir) if resume.log_dir is not None else ""
        result.nothing_to_do = (
            f"checkpoint {resume.path} is at step {resume.global_step} and trainer.max_steps is "
            f"{cfg.trainer.max_steps}: nothing to train, nothing written (a larger trainer.max_steps continues it)"
        )
        return result
    if cfg.compile:
        # Each run compiles afresh: the jobs of a multirun share one process, and the networks of every
        # path share one forward, whose compilations would otherwise add up to Dynamo's recompile limit.
        torch.compiler.reset()
        module.net.compile(fullgraph=True)  # in place: the state dict keeps its keys

    # A resumed run continues the run it came from: same TensorBoard folder, same checkpoint folder;
    # a branch (see resume.py) gets the next version folder.
    version = resume.version if resume is not None else None
    if version is None and process_zero():
        version = claim_version(project_path(cfg.paths.runs) / name, project_path(cfg.paths.checkpoints) / name)
    logger = TensorBoardLogger(
        save_dir=str(project_path(cfg.paths.runs)), name=name, version=version, default_hp_metric=False
    )
    checkpoint_dir = project_path(cfg.paths.checkpoints) / name / f"version_{logger.version}"
    # One process at a time writes a run's checkpoint folder: its lock file (checkpoints.RunLock) is held
    # until the end, and the operating system releases it when the process dies.
    lock = RunLock(checkpoint_dir) if process_zero() else None
    if lock is not None:
        lock.acquire()
    try:
        result = train_and_check(cfg, result, module, data, resume, logger, checkpoint_dir, start)
        if record and process_zero():
            record_end(Path(result.checkpoint).parent, result.steps, result.failures)
        return result
    finally:
        if lock is not None:
            lock.release()


def train_and_check(
    cfg: DictConfig,
    result: RunResult,
    module: RMSNormRegressor,
    data: SplitData,
    resume,
    logger: TensorBoardLogger,
    checkpoint_dir: Path,
    start: float,
) -> RunResult:
    """The body of ``run`` once its folders are known and locked: training, the end, the checks.

    Whatever stops it after this point is reported with the last good checkpoint (``last_good_line``)."""
    # step*.ckpt and last.ckpt, each written once its step's work is done, its validation included
    checkpoints = StepCheckpoints(checkpoint_dir, cfg.checkpoint.every_n_steps)

    def kept() -> str:
        folder = Path(checkpoints.dirpath) if checkpoints.dirpath else checkpoint_dir  # process 0's, broadcast
        return last_good_line(folder, resume.path if resume is not None else None)

    try:
        with writer_thread_errors_quiet():
            return train_and_check_body(cfg, result, module, data, resume, logger, checkpoint_dir, start, checkpoints)
    except (Interrupted, ContractError):
        raise
    except TrainingStopped as e:  # a non-finite loss, a parity check past the tolerance
        raise type(e)(f"{e}; {kept()}") from None
    except Exception as e:
        refused = write_failure(e)
        if refused is not None:
            raise OutputError(f"{describe_write_failure(refused, str(logger.log_dir))}; {kept()}") from e
        e.last_good = kept()
        raise
    except BaseException as e:  # a signal outside training (cli.Stopped), KeyboardInterrupt
        if not isinstance(e, SystemExit):
            e.last_good = kept()
        raise


def last_logged(log_dir: str, loss_name: str, step: int) -> dict[str, float]:
    """The last ``train/<loss>``, ``val/<loss>`` and ``val/ppl`` a run logged up to ``step``: what a run
    that had no step left to train (it finishes another process's end) reports as its training's."""
    scalars = read_scalars(log_dir) if Path(log_dir).is_dir() else {}
    found = {}
    for tag in (f"train/{loss_name}", f"val/{loss_name}", "val/ppl"):
        values = [v for s, v in scalars.get(tag, []) if s <= step]
        if values:
            found[tag] = values[-1]
    return found


def train_and_check_body(
    cfg: DictConfig,
    result: RunResult,
    module: RMSNormRegressor,
    data: SplitData,
    resume,
    logger: TensorBoardLogger,
    checkpoint_dir: Path,
    start: float,
    checkpoints: StepCheckpoints,
) -> RunResult:
    # Under data parallelism every process runs this function; process 0 alone writes files (Lightning
    # routes logging and checkpoint writing through it, and these lines follow the same rule).
    if process_zero():
        remove_stale_temporaries(checkpoint_dir)
        if resume is not None and resume.branch:
            result.branched_from = f"{resume.path} at step {resume.global_step}"
            mark_branch(logger, resume.path, resume.global_step)
        elif resume is not None:
            mark_restart(logger, resume.global_step)
        write_layout(logger, result.loss_name)
    parity = Parity(cfg.parity.every_n_steps)
    tokens = cfg.data.batch_size * cfg.model.seq_len if cfg.model.kind == "transformer" else None
    timer = StepTimer(norm_events=not cfg.compile, tokens_per_step=tokens)
    on_signal = SaveOnSignal(checkpoint_dir)
    trainer = L.Trainer(
        **trainer_kwargs(cfg),
        logger=logger,
        # in this order: the parity check before the step's timer starts, the timer stopped and the last
        # step's stop asked before the step's checkpoint is written (Lightning runs checkpoint callbacks last)
        callbacks=[parity, timer, ValidateAtLastStep(), checkpoints, on_signal, RecordIdentity(run_identity(cfg))]
        + ([StepProgressBar()] if cfg.trainer.enable_progress_bar else []),
        default_root_dir=str(checkpoint_dir),
    )
    fit_metrics, final = fit(trainer, module, data, resume, logger, checkpoint_dir, checkpoints, on_signal)
    trainer.test(module, datamodule=data, verbose=False)
    measured(result, trainer, module, parity, timer, logger, final, start)
    trained = module.net
    if sharded(module.net):  # FSDP2: the whole trained network, gathered with every process's part
        trained = network_copy(module.net, **module.network_kwargs())
    if not trainer.is_global_zero:
        return result  # the checks below read and write files: process 0 runs them, in one process
    return check_and_summarise(cfg, result, trainer, module, trained, data, parity, timer, logger, fit_metrics, start)


def fit(trainer, module, data, resume, logger, checkpoint_dir: Path, checkpoints, on_signal) -> tuple[dict, Path]:
    """``Trainer.fit``, then ``final.ckpt`` and ``last.ckpt``: one protected section, in which a signal is
    held (``on_signal``) and honoured at the end of its step, or, once the loops have made their last
    check, when both files are written (``Interrupted``). What follows them (the test, the checks, HPARAMS
    and the summary) is finished by a resume (``resume.resolve_resume``) until the run's end is recorded.
    Returns the fit's metrics and ``final.ckpt``."""
    with sigint_as_sigterm(on_signal), sigterm_recorded(on_signal):
        try:
            trainer.fit(module, datamodule=data, ckpt_path=str(resume.path) if resume else None, weights_only=True)
        except SystemExit:  # Lightning's exit on SIGTERM, and on KeyboardInterrupt
            if on_signal.saved is None:
                raise
            raise Interrupted(on_signal.signal_name, on_signal.saved, on_signal.step) from None
        on_signal.at_once = False  # a run that had no step left to train: its end's writes are held too
        fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}  # test() resets them
        if resume is not None and trainer.global_step == resume.global_step:  # no step left: finishing its end
            fit_metrics = {**last_logged(logger.log_dir, module.loss_name, trainer.global_step), **fit_metrics}
        final = checkpoint_dir / "final.ckpt"
        # final.ckpt is a result: a run finishing the end of a process stopped after writing it keeps it
        if not trainer.strategy.broadcast(final.exists()):
            trainer.save_checkpoint(final, weights_only=False)  # the full state: optimizer and loops too
        # last.ckpt is what ckpt_path=last resumes: after a completed run, that is the final state (which it
        # holds already when a resumed run had no step left to train: then it is left as it is).
        last = Path(checkpoints.dirpath) / "last.ckpt"
        if resume is None or trainer.global_step != resume.global_step or resume.branch:
            trainer.save_checkpoint(last, weights_only=False)
        late = on_signal.late
        if trainer.world_size > 1:  # every process stops here, or none: the test's collectives need all
            names = ["SIGINT", "SIGTERM"]
            flag = torch.tensor([float(names.index(late) + 1) if late else 0.0], device=trainer.strategy.root_device)
            agreed = int(trainer.strategy.reduce(flag, reduce_op="max").item())
            late = names[agreed - 1] if agreed else None
    if late is not None:
        raise Interrupted(late, last, trainer.global_step)
    return fit_metrics, final


def measured(result: RunResult, trainer, module, parity, timer, logger, final: Path, start: float) -> None:
    """What every process knows at the run's end, into ``result``: steps, files, calls, times."""
    result.steps = trainer.global_step
    result.log_dir = logger.log_dir
    result.checkpoint = str(final)
    result.calls = dict(module.calls)
    result.fallback_reason = module.fallback_reason or ""
    result.parity_skipped = parity.skipped or ""
    result.seconds = time.perf_counter() - start
    result.step_ms = statistics.median(timer.medians) if timer.medians else float("nan")
    result.rmsnorm_ms = statistics.median(timer.norm_medians) if timer.norm_medians else float("nan")


def check_and_summarise(
    cfg, result, trainer, module, trained, data, parity, timer, logger, fit_metrics, start
) -> RunResult:
    """Process 0: reload parity, the run's metrics, the end checks, HPARAMS."""
    diff, reloaded_impl = reload_max_abs_diff(trained, Path(result.checkpoint), data, trainer.strategy.root_device)
    logger.log_metrics({"reload/max_abs_diff": diff}, step=trainer.global_step)
    name = module.loss_name
    result.metrics = {
        # nan when a resumed run had no step left to train (its checkpoint was the last step's)
        f"train/{name}": fit_metrics.get(f"train/{name}", float("nan")),
        f"val/{name}": fit_metrics.get(f"val/{name}", float("nan")),
        **{k: v for k, v in fit_metrics.items() if k == "val/ppl"},
        **module.evaluation_metrics("test", float(module.test_loss)),
        "parity/checks": float(len(parity.checked_steps)),
        "reload/max_abs_diff": diff,
        "time/step_ms": result.step_ms,
        "time/rmsnorm_ms": result.rmsnorm_ms,
    }
    if timer.tokens_per_step:
        result.metrics["time/tokens_per_s"] = timer.tokens_per_step * trainer.world_size / (result.step_ms / 1e3)
    for path, verdict in parity.paths.items():
        result.metrics[parity_tag(path, "initial_output_err")] = verdict.output_err
        result.metrics[parity_tag(path, "initial_grad_err")] = verdict.grad_err
        result.metrics[parity_tag(path, "worst_over_tol")] = (
            verdict.worst_over_tol if parity.checked_steps else float("nan")
        )
        if verdict.norm_worst_layer:
            result.metrics[parity_tag(path, "norm_worst_over_tol")] = verdict.norm_worst_over_tol
            result.norm_worst_layers[path] = verdict.norm_worst_layer
    result.failures = failed_checks(cfg, result, parity, diff, reloaded_impl, module.calls_unknown_before)
    params = {**flat_hparams(cfg), "backend": backend()}
    if result.branched_from:
        params["branched_from"] = result.branched_from
    result.seconds = time.perf_counter() - start
    result.metrics["time/run_s"] = result.seconds
    logger.log_metrics({"time/run_s": result.seconds}, step=trainer.global_step)
    overridden = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    write_hparams(logger, params, name, overridden)
    return result
