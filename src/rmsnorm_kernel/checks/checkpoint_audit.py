"""The ``check-checkpoints`` command: every file under ``checkpoints/`` opened, checked and reproduced.

The training writes Lightning ``.ckpt`` files under ``checkpoints/<run>/``. Each holds, besides
Lightning's own keys, ``rmsnorm_kernel = {"test_inputs": Tensor, "test_outputs": Tensor}``: a batch of
the test split and the network's outputs on it, recorded when the file was written. The network is
rebuilt with ``rmsnorm_kernel.training.network.build_network(**hyper_parameters)``.

A file that fails is named with the stage it reached and why: the load error, the missing keys, the
rebuild error, each tensor that is not finite (a weight, or the recorded test batch) with its NaN and
inf counts, or, when the outputs are not reproduced, the largest absolute and relative difference and how
many values lie beyond the tolerance.
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
    stage: str  # "skipped", "load", "keys", "rebuild", "weights", "reproduce" or "verified"
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
