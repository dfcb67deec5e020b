"""The ``environment`` command: versions, GPU and driver, backend, and proof that the Triton path runs here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.backend import backend, kernel_device_type
from .campaigns import CAMPAIGNS, CampaignCase, run_campaign

#: The one shape and dtype of the proof: N not a power of two, several rows.
PROOF_SHAPE = (17, 257)
PROOF_DTYPE = torch.float32


@dataclass
class Fact:
    """One line of the environment report."""

    item: str
    value: str


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return "unknown (nvidia-smi not found)"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (subprocess.SubprocessError, OSError, IndexError) as exc:
        return f"unknown ({type(exc).__name__})"


def environment_facts() -> list[Fact]:
    import platform
    import sys

    import triton

    facts = [
        Fact("python", sys.version.split()[0]),
        Fact("platform", platform.platform()),
        Fact("torch", torch.__version__),
        Fact("triton", triton.__version__),
        Fact("lightning", _version("lightning")),
        Fact("hydra-core", _version("hydra-core")),
        Fact("tensorboard", _version("tensorboard")),
        Fact("matplotlib", _version("matplotlib")),
        Fact("torch built with CUDA", str(torch.version.cuda)),
        Fact("CUDA device visible", str(torch.cuda.is_available())),
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts.append(
                Fact(f"GPU {i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}")
            )
        facts.append(Fact("GPU driver", _driver_version()))
    else:
        facts.append(Fact("GPU", "none"))
    facts.append(Fact("rmsnorm_kernel backend", backend()))
    facts.append(Fact("kernel tensors live on", kernel_device_type()))
    return facts


def environment_proof(device: str | None = None) -> list[CampaignCase]:
    """One small forward and backward of the Triton path against the oracle: a visible GPU is not a usable one."""
    cases = []
    for campaign in CAMPAIGNS:
        cases += run_campaign(campaign, shapes=[PROOF_SHAPE], dtypes=[PROOF_DTYPE], device=device)
    return cases
