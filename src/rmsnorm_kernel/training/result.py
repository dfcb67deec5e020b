"""What a run reports back: ``RunResult`` (the summary, the multirun table and ``train.py``'s exit code
read it), and the fingerprint of its initial weights."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch


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
