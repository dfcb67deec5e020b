"""One training run from a composed configuration, and the checks that end it.

``run(cfg)`` trains the network of ``cfg.model.kind`` (the regression or the language model, ``network.py``)
with the RMSNorm path that ``cfg.norm.impl`` names and then checks:

- initial parity: on the first batch, from the same weights, the Triton path and the native path
  (``F.rms_norm``) each give the reference's outputs and gradients within the tolerance of
  ``ops/tolerances.py``, whichever path the run trains on (``callbacks.Parity``, which repeats the
  comparison every ``parity.every_n_steps`` steps and stops the run when it fails there);
- integration: the Triton path's wrappers ran once forward and once backward per norm call of each
  training step (``network.norm_calls_per_step``; the other paths never called them); a Triton run in
  which no training step ran on Triton fails, naming the fallback count and the first reason, even when
  every step fell back as allowed;
- reload parity: the final checkpoint, loaded into a fresh module, gives bit-identical test outputs and
  the same RMSNorm path.

Before the model is built, the runs and checkpoint folders are created and proved writable
(``paths.prepare_folder``); a refusal before any work removes the folders it created.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import statistics
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from torch.utils.tensorboard.summary import hparams as hparams_summary

from ..checks.report import WRITE_ERRNOS
from ..ops.backend import backend
from ..ops.contract import ContractError
from ..ops.counters import counting
from ..ops.tolerances import TOLERANCES
from .callbacks import (
    KERNEL,
    Interrupted,
    Parity,
    SaveOnSignal,
    StepCheckpoints,
    StepProgressBar,
    StepTimer,
    ValidateAtLastStep,
    parity_tag,
    sigint_as_sigterm,
)
from .checkpoints import AtomicCheckpointIO, RunLock, last_good_checkpoint, remove_stale_temporaries
from .config import MODEL_KINDS, ConfigError, count_devices, validate
from .data import SplitData, SyntheticRegressionData, TextData
from .events import read_scalars, run_event_writer, write_layout
from .model import RMSNormRegressor, TrainingStopped
from .network import LOSS_NAMES, network_copy, network_input, norm_calls_per_step, sharded
from .paths import NAME_DEFAULTS, claim_version, prepare_folder, project_path, remove_folders, run_name
from .resume import RecordIdentity, mark_branch, mark_restart, record_end, resolve_resume, run_identity


def process_zero() -> bool:
    """Global process 0, asked before the Trainer exists (Lightning sets ``rank_zero_only.rank`` to the
    global rank when the Trainer is built; before that it holds the environment's RANK, LOCAL_RANK or
    SLURM_PROCID, and under Lightning's own launcher NODE_RANK alone names the machine)."""
    return rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))) == 0


@dataclass
class RunResult:
    name: str
    impl: str
    seed: int
    backend: str
    loss_name: str = "mse"  # the metrics' name of the network's loss (network.LOSS_NAMES)
    norm_calls_per_step: int = 1  # RMSNorm calls in one forward of the network (network.norm_calls_per_step)
    steps: int = 0
    log_dir: str = ""
    checkpoint: str = ""
    initial_weights_sha256: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    #: per compared path, the norm layer that came closest to the tolerance over the run
    norm_worst_layers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    step_ms: float = float("nan")  # the median of the step timer's window medians
    rmsnorm_ms: float = float("nan")  # the same for the RMSNorm layers' GPU time (nan: not measured)
    failures: list[str] = field(default_factory=list)
    parity_skipped: str = ""  # why the initial parity check compared nothing
    fallback_reason: str = ""  # the first reason a training step went to the reference
    branched_from: str = ""  # "<checkpoint> at step <n>" when this run is a branch of another
    nothing_to_do: str = ""  # why a resume trained nothing and wrote nothing
    stopped: str = ""  # in a multirun, the one-line reason the job stopped before its end (cli.main)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.stopped


def state_dict_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def lightning_strategy(cfg: DictConfig) -> str | ModelParallelStrategy:
    """``trainer.strategy`` as Lightning takes it. ``fsdp2`` is FSDP2: Lightning's ``ModelParallelStrategy``
    with every process a data-parallel shard (the module's ``configure_model`` shards the network with
    ``fully_shard``), its checkpoints gathered whole into one file by process 0, the file every check and
    resume reads, as under DDP."""
    if cfg.trainer.strategy != "fsdp2":
        return cfg.trainer.strategy
    devices = cfg.trainer.devices
    plain = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    processes = count_devices(plain, cfg.trainer.accelerator) * cfg.trainer.num_nodes
    return ModelParallelStrategy(
        data_parallel_size=processes, tensor_parallel_size=1, save_distributed_checkpoint=False
    )


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


def reload_max_abs_diff(
    net: torch.nn.Module, checkpoint: Path, data: SplitData, device: torch.device
) -> tuple[float, str]:
    """Loads the checkpoint into a fresh module and runs the test split through it and the trained
    network ``net`` on ``device``.

    Returns the largest absolute difference of their outputs and the RMSNorm path the fresh module got.
    """
    net.to(device)  # Lightning hands the module back on the CPU after fit and test
    fresh = RMSNormRegressor.load_from_checkpoint(checkpoint, map_location=device, weights_only=True)
    net.eval()
    fresh.eval()
    worst = 0.0
    with torch.no_grad():
        for x, _ in DataLoader(data.test, batch_size=data.batch_size):  # every row, in this one process
            x = network_input(net, x.to(device))
            # .forward, not __call__: the eager network on both sides, also when training ran compiled
            a, b = net.forward(x), fresh.net.forward(x)
            if not torch.equal(a, b):
                worst = max(worst, float((a - b).abs().max()) if a.shape == b.shape else float("inf"))
    return worst, fresh.hparams.norm_impl


def flat_hparams(cfg: DictConfig) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop(NAME_DEFAULTS, None)  # the reference of the run's name, not a setting
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


def hparam_metrics(loss_name: str) -> tuple[str, ...]:
    """The HPARAMS tab's metrics: scalars every run logs (TensorBoard reads their values from the run's
    scalars): the losses of the three splits (``mse`` or ``loss``, ``network.LOSS_NAMES``) and the run's time."""
    return (f"train/{loss_name}", f"val/{loss_name}", f"test/{loss_name}", "time/run_s")


def write_hparams(logger: TensorBoardLogger, params: dict, metrics: dict[str, float], loss_name: str) -> None:
    """The run's configuration in TensorBoard's HPARAMS tab, with ``hparam_metrics`` as its metrics."""
    with run_event_writer(logger) as writer:
        for summary in hparams_summary(params, {k: metrics[k] for k in hparam_metrics(loss_name)}):
            writer.add_summary(summary)


def failed_checks(
    cfg: DictConfig,
    result: RunResult,
    parity: Parity,
    reload_diff: float,
    reloaded_impl: str,
    calls_unknown_before: int | None = None,
) -> list[str]:
    """The end-of-run checks that failed, one sentence each (see the module docstring).

    They cover the run's whole history: a resumed run gets the parity verdicts (``Parity.state_dict``) and
    the call counts (``RMSNormRegressor.on_save_checkpoint``) of every earlier step from its checkpoint. A
    checkpoint that lacks them leaves the earlier steps' verdicts unknown, and an unknown verdict fails:
    the run cannot claim what it did not see (each path's ``unknown_before`` in ``parity.paths``,
    ``calls_unknown_before``).
    """
    failures = []
    unknown: dict[int, list[str]] = {}  # a step a resume started at: the paths whose earlier verdicts are unknown
    for path, verdict in parity.paths.items():
        if verdict.unknown_before is not None:
            unknown.setdefault(verdict.unknown_before, []).append(path)
    for step, paths in unknown.items():
        failures.append(
            f"initial parity: unknown: this run resumed at step {step} from a checkpoint that carries no parity "
            f"verdicts of {' and '.join(paths)}, so the checks of the steps before it were not seen"
        )
    for path, verdict in parity.paths.items():
        along = [s for s in verdict.failed_steps if s > 0]
        if along:  # a check past the tolerance stops the run: only a checkpoint written at that step holds one
            failures.append(f"parity along the run: {path} past the tolerance at step {along[0]}")
    for path, verdict in parity.paths.items():
        if not verdict.ok:
            tol = TOLERANCES[parity.dtype]
            dtype = str(parity.dtype).removeprefix("torch.")
            failures.append(
                f"initial parity: {path} outputs differ from the reference by {verdict.output_err:.3g}, gradients "
                f"by {verdict.grad_err:.3g}, beyond the {dtype} tolerance (atol {tol.atol:g}, rtol {tol.rtol:g})"
            )
    # Every training step runs the Triton path once per norm call of the network, unless the contract sent
    # a call to the reference (norm.fallback=reference, counted); the other paths never run it.
    # (a Triton path that never ran for another reason fails the count below)
    if cfg.norm.impl == KERNEL and result.calls["train/fallback"] > 0 and result.calls["train/forward"] == 0:
        failures.append(
            f"integration: no training step ran on Triton: {result.calls['train/fallback']} of "
            f"{result.steps * result.norm_calls_per_step} norm calls in {result.steps} steps fell back to the "
            f"reference (first reason: {result.fallback_reason or 'not recorded'})"
        )
    per_run = result.steps * result.norm_calls_per_step
    expected = per_run - result.calls["train/fallback"] if cfg.norm.impl == KERNEL else 0
    if calls_unknown_before is not None:
        failures.append(
            f"integration: unknown: this run resumed at step {calls_unknown_before} from a checkpoint that "
            "carries no Triton call counts, so the calls of the steps before it were not counted"
        )
    for key in ("train/forward", "train/backward"):
        if calls_unknown_before is None and result.calls[key] != expected:
            failures.append(
                f"integration: {result.calls[key]} Triton {key.split('/')[1]} calls in {result.steps} "
                f"training steps on the {cfg.norm.impl} path; expected {expected}"
            )
    if reload_diff != 0.0:
        failures.append(
            f"reload parity: test outputs differ by {reload_diff:.3g} after reloading {result.checkpoint} (must be 0)"
        )
    if reloaded_impl != cfg.norm.impl:
        failures.append(
            f"reload parity: {result.checkpoint} reloaded with norm {reloaded_impl!r}, trained with {cfg.norm.impl!r}"
        )
    return failures


def check_precision(cfg: DictConfig) -> None:
    """Refuse a precision that Lightning would replace by another on this machine: the configuration and
    HPARAMS must record what runs. On the CPU, Lightning runs ``16-mixed`` as ``bf16-mixed``."""
    accelerator = str(cfg.trainer.accelerator)
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and str(cfg.trainer.precision) == "16-mixed":
        raise ConfigError(
            "trainer.precision is '16-mixed', which Lightning runs as bf16-mixed on the CPU; "
            "accepted on the CPU: 32-true, 32, bf16-mixed"
        )


class OutputError(RuntimeError):
    """A file of the run could not be written (a full disk, an I/O error): the message names the cause,
    the file or folder, and the last good checkpoint."""


def write_failure(error: BaseException) -> OSError | None:
    """The refused write behind ``error``, if any: an ``OSError`` of ``WRITE_ERRNOS`` in its chain of
    causes (Lightning reports a failed TensorBoard write as a ValueError about the logged value)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in WRITE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def describe_write_failure(error: OSError, log_dir: str) -> str:
    """``disk full: No space left on device, writing <file>`` (the TensorBoard folder for its event files,
    whose writer thread does not name them)."""
    cause = "disk full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "write failed"
    if error.filename:
        where = str(error.filename)
    elif any(f"{os.sep}tensorboard{os.sep}" in frame.filename for frame in traceback.extract_tb(error.__traceback__)):
        where = f"the TensorBoard event files in {log_dir}"
    else:
        where = "a file of the run"
    return f"{cause}: {os.strerror(error.errno)}, writing {where}"


def last_good_line(folder: Path, resumed_from: Path | None) -> str:
    """The end of each line that reports a run stopped after set-up: its last good checkpoint."""
    kept = last_good_checkpoint(folder, resumed_from)
    if kept is None:
        return "no checkpoint had been written yet"
    if resumed_from is not None and kept == Path(resumed_from) and kept.parent != folder:
        return f"the last good checkpoint is {kept} (the one this run resumed from)"
    return f"the last good checkpoint is {kept}"


@contextlib.contextmanager
def sigterm_left_to_lightning(on_signal: SaveOnSignal):
    """While training and until ``final.ckpt`` and ``last.ckpt`` are written, SIGTERM is Lightning's and
    ``on_signal``'s (``callbacks.SaveOnSignal``): Lightning also calls a handler it finds in place, and
    the command's own (``cli.signals_stop_the_command``) would stop the step, or the end's writes, where
    they are. The handler in place records the signal (``SaveOnSignal.outside_hold``). Put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, on_signal.outside_hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def writer_thread_errors_quiet():
    """TensorBoard writes its event files from a thread: a write the disk refuses is raised again at the
    next write of the training process, which reports it in one line; the thread's own traceback is not
    printed."""
    previous = threading.excepthook

    def hook(args) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


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
        max_steps=cfg.trainer.max_steps,
        val_check_interval=cfg.trainer.val_check_interval,
        check_val_every_n_epoch=None,  # val_check_interval counts steps across epochs
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=lightning_strategy(cfg),
        precision=cfg.trainer.precision,
        deterministic=cfg.trainer.deterministic,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        enable_model_summary=False,
        log_every_n_steps=cfg.trainer.log_every_n_steps,  # the step timer's window
        logger=logger,
        # in this order: the parity check before the step's timer starts, the timer stopped and the last
        # step's stop asked before the step's checkpoint is written (Lightning runs checkpoint callbacks last)
        callbacks=[parity, timer, ValidateAtLastStep(), checkpoints, on_signal, RecordIdentity(run_identity(cfg))]
        + ([StepProgressBar()] if cfg.trainer.enable_progress_bar else []),
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(checkpoint_dir),
        use_distributed_sampler=False,  # evaluation splits are sharded without padding (data.py)
    )
    # One protected section from the first step to the written final.ckpt and last.ckpt: a signal is held
    # (callbacks.SaveOnSignal) and honoured at the end of its step, or, once the loops have made their
    # last check, when both files are written. What follows them (the test, the checks, HPARAMS and the
    # summary) is finished by a resume (resume.resolve_resume) until the run's end is recorded.
    with sigint_as_sigterm(on_signal), sigterm_left_to_lightning(on_signal):
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
    trainer.test(module, datamodule=data, verbose=False)

    result.steps = trainer.global_step
    result.log_dir = logger.log_dir
    result.checkpoint = str(final)
    result.calls = dict(module.calls)
    result.fallback_reason = module.fallback_reason or ""
    result.parity_skipped = parity.skipped or ""
    result.seconds = time.perf_counter() - start
    result.step_ms = statistics.median(timer.medians) if timer.medians else float("nan")
    result.rmsnorm_ms = statistics.median(timer.norm_medians) if timer.norm_medians else float("nan")
    trained = module.net
    if sharded(module.net):  # FSDP2: the whole trained network, gathered with every process's part
        trained = network_copy(module.net, **module.network_kwargs())
    if not trainer.is_global_zero:
        return result  # the checks below read and write files: process 0 runs them, in one process
    diff, reloaded_impl = reload_max_abs_diff(trained, final, data, trainer.strategy.root_device)
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
    write_hparams(logger, params, result.metrics, name)
    return result
