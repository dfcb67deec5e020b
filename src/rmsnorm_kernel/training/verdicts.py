"""The checks that end a run (``failed_checks``): parity at step 0 and along the run, the Triton calls of
every training step (integration), and reload parity (``reload_max_abs_diff``: the final checkpoint,
loaded into a fresh module, gives bit-identical test outputs and the same RMSNorm path)."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from ..ops.tolerances import TOLERANCES
from .data import SplitData
from .model import RMSNormRegressor
from .network import network_input
from .parity import KERNEL, Parity
from .result import RunResult


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
