"""What several test modules of ``tests/checks`` share: running the command line in-process, reading its
reports, and building the files the commands read (checkpoints, a project tree)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from rmsnorm_kernel.checks.compile_report import demo_network
from rmsnorm_kernel.checks.main import main
from rmsnorm_kernel.training.network import build_network


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``main(argv)`` run in this process."""
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def read_report(outputs: Path, command: str) -> dict:
    return json.loads((Path(outputs) / f"{command}.json").read_text())


# --------------------------------------------------------------------------------------------------
# Checkpoints in the training's format


HPARAMS = {"input_dim": 6, "hidden_dim": 33, "output_dim": 2, "norm_impl": "triton", "eps": 1e-6, "lr": 1e-3}


def write_checkpoint(
    path: Path, device: str, seed: int = 0, prefix: str = "net.", tamper: float = 0.0, builder=build_network
) -> Path:
    """A checkpoint as the training writes it: Lightning's keys plus a batch of test inputs and the
    network's outputs on them (shifted by ``tamper``, to make a file whose record does not reproduce).
    ``builder`` makes the network from the hyper-parameters: the demo network's unless given."""
    torch.manual_seed(seed)
    net = builder(**{k: v for k, v in HPARAMS.items() if k != "lr"}).to(device)
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        inputs = torch.randn(5, HPARAMS["input_dim"], device=device)
        outputs = net(inputs) + tamper
    adam = torch.optim.Adam(net.parameters(), lr=HPARAMS["lr"])
    for _ in range(3):  # three steps of a zero loss: Adam's state, the weights unchanged
        sum((p * 0).sum() for p in net.parameters()).backward()
        adam.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "epoch": 0,
            "global_step": 3,
            "pytorch-lightning_version": "2.5.0",
            "state_dict": {prefix + k: v.cpu() for k, v in net.state_dict().items()},
            "hyper_parameters": dict(HPARAMS),
            "optimizer_states": [adam.state_dict()],
            "loops": {
                "fit_loop": {
                    "state_dict": {"combined_loader": [{"seed": 0, "global_batch": 4, "num_batches": 8}]},
                    "epoch_progress": {"current": {"completed": 0}},
                    "epoch_loop.automatic_optimization.optim_progress": {
                        "optimizer": {"step": {"total": {"completed": 3}}}
                    },
                }
            },
            "datamodule_hyper_parameters": {"batch_size": 4, "train_size": 32, "shuffle_seed": 0},
            "rng": {"torch": torch.get_rng_state()},
            "calls": {"train/forward": 3, "train/backward": 3},
            "callbacks": {"Parity": {"ok": True, "checked_steps": [0]}},
            "rmsnorm_kernel": {"test_inputs": inputs.cpu(), "test_outputs": outputs.cpu()},
        },
        path,
    )
    return path


# --------------------------------------------------------------------------------------------------
# A project tree for clean


def make_project(root: Path, name: str = "rmsnorm_kernel") -> Path:
    """A project named ``name`` with generated directories, sources, and two virtual environments."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    for d in (
        "outputs/hydra",
        "runs/triton_seed0/version_0",
        "checkpoints/triton_seed0",
        "multirun",
        ".pytest_cache",
        "src/pkg/__pycache__",
        "tests/__pycache__",
        ".venv/lib/__pycache__",
        "venv2/lib/__pycache__",
        "conf",
    ):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "venv2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "runs" / "triton_seed0" / "version_0" / "events.out.tfevents.1").write_text("x")
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"\0")
    (root / "conf" / "config.yaml").write_text("seed: 0\n")
    return root


# --------------------------------------------------------------------------------------------------
# A network with a graph break


class BreakingNet(nn.Module):
    """The compile report's network with data-dependent Python control flow in its forward: a graph break."""

    def __init__(self):
        super().__init__()
        self.net = demo_network()

    def forward(self, x):
        h = self.net.norm(self.net.inp(x))
        if h.sum().item() > 1e30:
            h = h * 2
        return self.net.out(h)


# --------------------------------------------------------------------------------------------------
# Each command and its work

#: A command line of each command, and its work (module, function) that must not run on a usage mistake.
WORK = {
    "environment": (["environment"], "environment", "environment_facts"),
    "reference": (["reference"], "gradients", "reference_checks"),
    "check-forward": (["check-forward", "--quick"], "campaigns", "run_campaign"),
    "check-backward": (["check-backward", "--quick"], "campaigns", "run_campaign"),
    "check-gamma": (["check-gamma", "--quick"], "campaigns", "run_campaign"),
    "check-residual": (["check-residual", "--quick"], "campaigns", "run_campaign"),
    "negative": (["negative", "--quick"], "negative", "negative_checks"),
    "exercise": (["exercise"], "exercise", "exercise"),
    "profile": (["profile"], "profile", "profile_counts"),
    "compile-report": (["compile-report"], "compile_report", "compile_report"),
    "figures": (["figures"], "figures", "make_figures"),
    "check-checkpoints": (["check-checkpoints"], "checkpoint_audit", "audit_checkpoints"),
    "clean": (["clean", "--scope", "generated", "--dry-run"], "clean", "clean_generated"),
}


def patch_work(monkeypatch, command, effect):
    """``effect`` in place of the work of ``command`` (``WORK``)."""
    import importlib

    _, module, name = WORK[command]
    monkeypatch.setattr(importlib.import_module(f"rmsnorm_kernel.checks.{module}"), name, effect)
