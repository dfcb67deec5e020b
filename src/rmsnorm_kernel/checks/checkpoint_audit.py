"""The ``check-checkpoints`` command: every file under ``checkpoints/`` opened, checked and reproduced.

The training writes Lightning ``.ckpt`` files under ``checkpoints/<run>/``. Each holds, besides
Lightning's own keys, ``rmsnorm_kernel = {"test_inputs": Tensor, "test_outputs": Tensor}``: a batch of
the test split and the network's outputs on it, recorded when the file was written. The network is
rebuilt with ``rmsnorm_kernel.training.network.build_network(**hyper_parameters)``.

Besides the weights, a checkpoint must hold everything a resume (``ckpt_path=...``) needs, each checked
(``resume_problems``): Adam's state for every parameter (``exp_avg`` and ``exp_avg_sq`` finite and of
the parameter's shape, the same whole step count for each, not past the global step, a finite learning
rate), the random generators' state, the training data's position (the training batches' state that
``training.data.ResumableBatches`` saves, matching the data module's hyper-parameters it was made from)
and the loops' step counters (the global step, equal to the loops' optimizer steps; the epoch).

A file that fails is named with the stage it reached and why, in one line: the load error, the missing
keys, the rebuild error, each tensor that is not finite (a weight, or the recorded test batch) with its
NaN and inf counts, every part of the resume state that is missing or wrong, or, when the outputs are not
reproduced, the largest absolute and relative difference and how many values lie beyond the tolerance.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.backend import kernel_device_type
from ..ops.tolerances import compare
from .report import one_line

CHECKPOINT_SUFFIX = ".ckpt"
CHECKPOINT_KEYS = ("state_dict", "hyper_parameters", "rmsnorm_kernel")
RECORD_KEYS = ("test_inputs", "test_outputs")


@dataclass
class CheckpointAudit:
    """The verdict on one file under ``checkpoints/``; ``stage`` is the last step reached."""

    file: str
    stage: str  # "skipped", "load", "keys", "rebuild", "weights", "resume", "reproduce" or "verified"
    ok: bool
    detail: str
    max_abs: float = math.nan
    max_rel: float = math.nan


def _import_build_network() -> tuple[Callable | None, str]:
    try:
        from ..training.network import build_network
    except Exception as exc:  # ImportError, or the module failing while it loads
        return None, f"rmsnorm_kernel.training.network.build_network is not importable ({type(exc).__name__}: {exc})"
    return build_network, ""


def _accepted_kwargs(fn: Callable, hparams: dict) -> dict:
    """The hyper-parameters ``fn`` takes: a LightningModule also saves its own (the learning rate...)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(hparams)
    names = {
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in hparams.items() if k in names}


def _match_state_dict(saved: dict, expected_keys: set[str]) -> dict | None:
    """``saved`` with the prefix stripped under which Lightning stored the network (``net.``, ``model.``...)."""
    prefixes = {""}
    for key in saved:
        parts = key.split(".")
        prefixes.update(".".join(parts[:i]) + "." for i in range(1, len(parts)))
    for prefix in sorted(prefixes, key=len):
        stripped = {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
        if set(stripped) == expected_keys:
            return stripped
    return None


def audit_checkpoint(
    path: Path, build_network: Callable | None, import_problem: str = "", device: str | None = None
) -> CheckpointAudit:
    """Open, check keys, rebuild, and reproduce the recorded test outputs; never raises."""
    from ..training.checkpoints import CheckpointError, read_checkpoint  # needs Lightning (the "train" extra)

    name = str(path)
    try:
        ckpt = read_checkpoint(path, required=())  # weights_only=True, after a CRC check of every record
    except CheckpointError as exc:
        return CheckpointAudit(name, "load", False, one_line(exc))
    except Exception as exc:
        return CheckpointAudit(name, "load", False, f"damaged or not loadable with weights_only=True ({one_line(exc)})")
    if not isinstance(ckpt, dict):
        return CheckpointAudit(
            name, "keys", False, f"holds a {type(ckpt).__name__}; accepted: a Lightning checkpoint dict"
        )
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    if missing:
        return CheckpointAudit(
            name, "keys", False, f"missing key(s) {missing}; expected {list(CHECKPOINT_KEYS)} (foreign or older file?)"
        )
    record, hparams, state = ckpt["rmsnorm_kernel"], ckpt["hyper_parameters"], ckpt["state_dict"]
    if not isinstance(record, dict) or not all(isinstance(record.get(k), torch.Tensor) for k in RECORD_KEYS):
        return CheckpointAudit(
            name, "keys", False, f"rmsnorm_kernel entry is not a dict with tensors {list(RECORD_KEYS)}"
        )
    if not isinstance(hparams, dict) or not isinstance(state, dict):
        return CheckpointAudit(name, "keys", False, "hyper_parameters and state_dict must both be dicts")
    if build_network is None:
        return CheckpointAudit(name, "rebuild", False, f"cannot rebuild the network: {import_problem}")
    device = device or kernel_device_type()
    try:
        net = build_network(**_accepted_kwargs(build_network, hparams))
        expected_keys = set(net.state_dict())
        matched = _match_state_dict(state, expected_keys)
        if matched is None:
            return CheckpointAudit(
                name,
                "rebuild",
                False,
                f"state_dict keys do not fit build_network(**hyper_parameters): "
                f"network expects {sorted(expected_keys)[:4]}..., file has {sorted(state)[:4]}...",
            )
        net.load_state_dict(matched)
    except Exception as exc:
        return CheckpointAudit(name, "rebuild", False, f"build_network(**hyper_parameters) failed ({one_line(exc)})")
    bad = non_finite(state) + non_finite(record, "rmsnorm_kernel.")
    if bad:
        return CheckpointAudit(
            name,
            "weights",
            False,
            "not finite: " + "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more tensor(s)" if len(bad) > 3 else ""),
        )
    problems = resume_problems(ckpt, list(net.parameters()))
    if problems:
        return CheckpointAudit(name, "resume", False, "cannot be resumed: " + "; ".join(problems))
    try:
        net = net.to(device).eval()
        with torch.no_grad():
            got = net(record["test_inputs"].to(device))
        expected = record["test_outputs"]
        if got.shape != expected.shape:
            return CheckpointAudit(
                name,
                "reproduce",
                False,
                f"the network gives outputs of shape {tuple(got.shape)} on the recorded test inputs; "
                f"recorded: {tuple(expected.shape)}",
            )
        c = compare(got, expected)
    except Exception as exc:
        return CheckpointAudit(
            name, "reproduce", False, f"running the network on the recorded test inputs failed ({one_line(exc)})"
        )
    if not c.ok:
        measured = bool(torch.isfinite(got).all())  # a non-finite output has no difference to measure
        return CheckpointAudit(
            name,
            "reproduce",
            False,
            mismatch(got, expected, c),
            c.max_abs if measured else math.nan,
            c.max_rel if measured else math.nan,
        )
    return CheckpointAudit(
        name, "verified", True, f"reproduces {tuple(expected.shape)} recorded test outputs", c.max_abs, c.max_rel
    )


def _get(tree, *keys):
    """``tree[k0][k1]...``, or None where a key is missing or a level is not a dict (or a list, for ints)."""
    for key in keys:
        if isinstance(tree, dict) and key in tree:
            tree = tree[key]
        elif isinstance(tree, list) and isinstance(key, int) and -len(tree) <= key < len(tree):
            tree = tree[key]
        else:
            return None
    return tree


def _whole(value) -> int | None:
    """``value`` as an int when it is a whole number (an int, or a one-element tensor holding one), else None."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


#: The loops' optimizer step counter, which Lightning restores the global step from.
OPTIMIZER_STEPS = (
    "fit_loop",
    "epoch_loop.automatic_optimization.optim_progress",
    "optimizer",
    "step",
    "total",
    "completed",
)


def resume_problems(ckpt: dict, params: list[torch.Tensor]) -> list[str]:
    """What a resume from ``ckpt`` would lack or trip on, one phrase each (empty when it can resume).
    ``params``: the rebuilt network's parameters, in the order the optimizer holds them."""
    problems: list[str] = []
    global_step = _whole(ckpt.get("global_step"))
    if global_step is None or global_step < 0:
        problems.append(f"global_step is {ckpt.get('global_step')!r}; expected a whole number >= 0")
    # the loops' step counters
    loops = ckpt.get("loops")
    if not isinstance(loops, dict):
        problems.append("no loops state (the loops' step counters)")
    else:
        done = _whole(_get(loops, *OPTIMIZER_STEPS))
        if done is None:
            problems.append("loops: no optimizer step count")
        elif global_step is not None and done != global_step:
            problems.append(f"loops: {done} optimizer steps, but global_step is {global_step}")
        epoch, completed = (
            _whole(ckpt.get("epoch")),
            _whole(_get(loops, "fit_loop", "epoch_progress", "current", "completed")),
        )
        if epoch is None or epoch < 0 or completed is None or epoch != completed:
            problems.append(f"loops: epoch {ckpt.get('epoch')!r} and completed epochs {completed!r} disagree")
    # the optimizer's state
    problems += _optimizer_problems(ckpt.get("optimizer_states"), params, global_step)
    # the random generators
    rng = _get(ckpt, "rng", "torch")
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8 or rng.numel() == 0:
        problems.append("no random generator state (rng.torch)")
    # the training data's position: the training batches' layout, with the global step
    problems += _data_problems(ckpt)
    # the verdicts so far: without them a resumed run reports its earlier checks as unknown
    if not isinstance(ckpt.get("calls"), dict):
        problems.append("no call counts (calls): a resume would report the integration check as unknown")
    callbacks = ckpt.get("callbacks")
    if not isinstance(callbacks, dict) or not any(k.startswith("Parity") for k in callbacks):
        problems.append("no parity verdicts (callbacks.Parity): a resume would report them as unknown")
    return problems


def _optimizer_problems(states, params: list[torch.Tensor], global_step: int | None) -> list[str]:
    if not isinstance(states, list) or len(states) != 1 or not isinstance(states[0], dict):
        return ["no optimizer state (optimizer_states: one optimizer expected)"]
    state, groups = states[0].get("state"), states[0].get("param_groups")
    if not isinstance(state, dict) or not isinstance(groups, list) or not groups:
        return ["optimizer state without state or param_groups"]
    problems = []
    indices = [i for g in groups if isinstance(g, dict) for i in g.get("params", [])]
    if len(indices) != len(params):
        problems.append(f"optimizer: {len(indices)} parameters, the network has {len(params)}")
    for g in groups:
        lr = g.get("lr") if isinstance(g, dict) else None
        if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            problems.append(f"optimizer: learning rate {lr!r}; expected a finite number > 0")
    steps = set()
    for index, param in zip(indices, params):
        entry = state.get(index)
        if not isinstance(entry, dict):
            problems.append(f"optimizer: no state for parameter {index}")
            continue
        for key in ("exp_avg", "exp_avg_sq"):
            t = entry.get(key)
            if not isinstance(t, torch.Tensor):
                problems.append(f"optimizer: parameter {index} has no {key}")
            elif t.shape != param.shape:
                problems.append(
                    f"optimizer: parameter {index} {key} of shape {tuple(t.shape)}; "
                    f"the parameter's is {tuple(param.shape)}"
                )
            else:
                problems += [f"optimizer: {bad}" for bad in non_finite({key: t}, f"parameter {index} ")]
        step = _whole(entry.get("step"))
        if step is None or step < 0 or (global_step is not None and step > global_step):
            problems.append(
                f"optimizer: parameter {index} step {entry.get('step')!r}; expected a whole number "
                f"from 0 to the global step {global_step}"
            )
        steps.add(step)
    if len(steps) > 1:
        problems.append(f"optimizer: the parameters' step counts differ ({sorted(map(str, steps))})")
    return problems


def _data_problems(ckpt: dict) -> list[str]:
    position = _get(ckpt, "loops", "fit_loop", "state_dict", "combined_loader", 0)
    data = ckpt.get("datamodule_hyper_parameters")
    if not isinstance(position, dict):
        return ["no training data position (loops.fit_loop.state_dict.combined_loader)"]
    if not isinstance(data, dict):
        return ["no data module hyper-parameters (datamodule_hyper_parameters): the data cannot be rebuilt"]
    seed, global_batch, num_batches = (_whole(position.get(k)) for k in ("seed", "global_batch", "num_batches"))
    batch_size, train_size = _whole(data.get("batch_size")), _whole(data.get("train_size"))
    if None in (seed, global_batch, num_batches, batch_size, train_size) or batch_size <= 0 or global_batch <= 0:
        return [f"training data position {position} or data hyper-parameters incomplete"]
    problems = []
    if seed != _whole(data.get("shuffle_seed")):
        problems.append(
            f"training data position: seed {seed}, the data module's shuffle_seed {data.get('shuffle_seed')!r}"
        )
    if global_batch % batch_size or num_batches != train_size // global_batch:
        problems.append(
            f"training data position: {num_batches} global batches of {global_batch}; the data module's "
            f"{train_size} examples in batches of {batch_size} per process give {train_size // global_batch}"
            if global_batch % batch_size == 0
            else f"training data position: a global batch of {global_batch}, no multiple of the batch size {batch_size}"
        )
    return problems


def non_finite(tensors: dict, prefix: str = "") -> list[str]:
    """``name (n NaN, m inf of k values)`` for each floating-point tensor of ``tensors`` that is not all finite."""
    found = []
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            found.append(f"{prefix}{key} ({nan} NaN, {inf} inf of {t.numel()} values)")
    return found


def mismatch(got: torch.Tensor, expected: torch.Tensor, c) -> str:
    """Why the outputs are not those recorded: the largest difference and how many values exceed the
    tolerance, or the non-finite outputs (which have no difference to measure)."""
    got64, exp64 = got.detach().cpu().double(), expected.detach().cpu().double()
    count = int((~torch.isfinite(got64)).sum())
    if count:
        return (
            f"the network's outputs on the recorded test inputs hold {count} non-finite value(s) of {got64.numel()}; "
            f"the recorded outputs are finite"
        )
    beyond = int(((got64 - exp64).abs() > c.tolerance.atol + c.tolerance.rtol * exp64.abs()).sum())
    return (
        f"outputs differ from those recorded at save time: "
        f"max abs difference {c.max_abs:.3g} (max rel {c.max_rel:.3g}); "
        f"{beyond} of {got64.numel()} values beyond atol {c.tolerance.atol:g} + rtol {c.tolerance.rtol:g} * |recorded|"
    )


def audit_checkpoints(
    root: Path, build_network: Callable | None = None, device: str | None = None
) -> list[CheckpointAudit]:
    """Audit every ``*.ckpt`` under ``root``; other files are listed as skipped. ``build_network`` defaults to
    the demo network's (``training.network``)."""
    root = Path(root)
    import_problem = ""
    if build_network is None:
        build_network, import_problem = _import_build_network()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    results = []
    for path in files:
        if path.suffix != CHECKPOINT_SUFFIX:
            results.append(CheckpointAudit(str(path), "skipped", True, f"not a {CHECKPOINT_SUFFIX} file"))
        else:
            results.append(audit_checkpoint(path, build_network, import_problem, device))
    return results
