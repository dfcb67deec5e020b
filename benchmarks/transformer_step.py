"""Where a training step of the language model spends its GPU time, per RMSNorm path: the kernels of
``model=transformer_large`` under ``torch.profiler``, summed by what they compute.

The network is the training preset's (``build_network(kind="transformer", ...)`` with the sizes of
``conf/model/transformer_large.yaml``), in bfloat16 as ``trainer.precision=bf16-true`` runs it, with the
cross-entropy of ``training.network.loss`` and Adam, in a plain loop (no Lightning) on one fixed random
batch of token ids. Every path starts from the same seed, so from the same weights and batch. Compiled
rows compile the network in place with ``fullgraph=True``, as ``train.py compile=true`` does; the loss
and Adam stay eager.

Per row, after ``--warmup`` steps (compilation happens there): the median wall time of ``--steps`` steps
(``train_step.wall_times``: ``time.perf_counter`` between two ``torch.cuda.synchronize()``), then
``PROFILE_STEPS`` profiled steps: the device kernels' GPU time per step and its split by ``CATEGORIES``,
the first that names a kernel:

- ``norm``: the RMSNorm's kernels, by ``train_step.norm_kernel``'s rule: the Triton path's own, aten's, or
  an Inductor kernel with the norm among the ops it fused (with whatever it fused: the residual add, or
  in the backward the sum of the gradients that reach the norm's output);
- ``gemm``, ``attention``, ``optimizer`` by their library's kernel names; ``other``: the rest (Inductor's
  pointwise kernels: rotary embedding, SwiGLU, the adds it did not fuse).

Each row's JSON lists every kernel with its time per step and category, so a split can be checked.

    python -m benchmarks.transformer_step [--paths reference,native,triton] [--modes compile,eager]
        [--steps N] [--warmup N] [--json PATH]
    python -m benchmarks.transformer_step --table outputs/transformer_step.json

Needs a CUDA GPU: without one it says so in one line and exits 2 (``--table`` needs none).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

from rmsnorm_kernel import tables
from rmsnorm_kernel.checks.report import one_line
from rmsnorm_kernel.ops.reference import DEFAULT_EPS
from rmsnorm_kernel.training.network import build_network, loss

from .common import (
    OneLineParser,
    at_least,
    cannot_start,
    comma_choices,
    exit_status,
    keep_earlier_run,
    print_table,
    run_interruptible,
    write_json,
)
from .impls import versions
from .train_step import NORM_RULE, is_copy, norm_kernel, profile_kernels, project_kernels, wall_times

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "model" / "transformer_large.yaml"
DEFAULT_JSON = Path("outputs") / "transformer_step.json"
KIND = "transformer_step"
PATHS = ("reference", "native", "triton")
MODES = ("compile", "eager")
PROFILE_STEPS = 5
SEED = 0
#: What a kernel computes, by its name, after the norm's rule: the first pattern that matches.
CATEGORIES = (
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)),
    # cuDNN runs only attention here (the network has no convolutions)
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.IGNORECASE)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply", re.IGNORECASE)),
)
CATEGORY_NAMES = ("norm", *(name for name, _ in CATEGORIES), "other")


def load_sizes(path: Path = PRESET) -> dict:
    """The language model's sizes, learning rate and windows per step from a model preset."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    model, data = cfg["model"], cfg["data"]
    sizes = {k: int(model[k]) for k in ("dim", "layers", "heads", "mlp_hidden", "seq_len")}
    return dict(sizes, qk_norm=bool(model["qk_norm"]), lr=float(model["lr"]), batch_size=int(data["batch_size"]))


def category(name: str, own: tuple[str, ...]) -> str:
    """The first of ``CATEGORY_NAMES`` that kernel ``name`` belongs to."""
    if norm_kernel(name, own) is not None:
        return "norm"
    return next((c for c, pattern in CATEGORIES if pattern.search(name)), "other")


def make_step(path: str, mode: str, sizes: dict, device: str, dtype: str = "bfloat16"):
    """One training step of a fresh network and Adam on a fixed batch of token ids; returns the loss."""
    torch.manual_seed(SEED)
    shape = {k: sizes[k] for k in ("dim", "layers", "heads", "mlp_hidden", "seq_len", "qk_norm")}
    net = build_network(None, None, None, path, DEFAULT_EPS, dtype=dtype, kind="transformer", **shape).to(device)
    if mode == "compile":
        torch.compiler.reset()  # each row compiles from a clean cache
        net.compile(fullgraph=True)
    opt = torch.optim.Adam(net.parameters(), lr=sizes["lr"])
    g = torch.Generator(device=device).manual_seed(SEED)
    tokens = torch.randint(0, 256, (sizes["batch_size"], sizes["seq_len"] + 1), device=device, generator=g)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        value = loss("transformer", net(inputs), targets)
        value.backward()
        opt.step()
        return value

    return step


def split(events: list[tuple[str, float]], steps: int, own: tuple[str, ...]) -> dict:
    """Per step: the kernels' GPU time (ms), their count, the time of each category, and every kernel by
    name with its category, longest first (copies and memsets apart)."""
    by_name: dict[str, list[float]] = {}
    for name, us in events:
        if not is_copy(name):
            by_name.setdefault(name, []).append(us)
    kernels = [
        dict(name=n, us_per_step=sum(v) / steps, per_step=len(v) / steps, category=category(n, own))
        for n, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    ]
    by_category = {c: sum(k["us_per_step"] for k in kernels if k["category"] == c) / 1e3 for c in CATEGORY_NAMES}
    return dict(
        gpu_ms=sum(by_category.values()),
        kernels_per_step=sum(k["per_step"] for k in kernels),
        category_ms=by_category,
        kernels=kernels,
    )


def measure(path: str, mode: str, sizes: dict, steps: int, warmup: int, own: tuple[str, ...]) -> dict:
    step = make_step(path, mode, sizes, "cuda")
    for _ in range(warmup):
        step()
    times, _ = wall_times(step, steps)
    profiled = split(profile_kernels(step, PROFILE_STEPS), PROFILE_STEPS, own)
    return dict(path=path, mode=mode, wall_ms=1e3 * statistics.median(times), error=None, **profiled)


def markdown(data: dict) -> str:
    head = ("path", "mode", "wall ms", "GPU ms", *(f"{c} ms" for c in CATEGORY_NAMES), "kernels")
    rows = []
    for r in data["rows"]:
        if r["error"] is not None:
            rows.append((r["path"], r["mode"], f"failed: {r['error']}"))
            continue
        cats = (f"{r['category_ms'][c]:.2f}" for c in CATEGORY_NAMES)
        cells = (
            r["path"],
            r["mode"],
            f"{r['wall_ms']:.2f}",
            f"{r['gpu_ms']:.2f}",
            *cats,
            f"{r['kernels_per_step']:.0f}",
        )
        rows.append(cells)
    return tables.table(head, rows, markdown=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m benchmarks.transformer_step", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--paths", type=comma_choices("path", PATHS), default=list(PATHS), help="default: all")
    parser.add_argument("--modes", type=comma_choices("mode", MODES), default=["compile"], help="default: compile")
    parser.add_argument("--steps", type=at_least(1), default=20, help="timed steps per row (default 20)")
    parser.add_argument("--warmup", type=at_least(1), default=5, help="steps before timing (default 5)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    parser.add_argument("--table", type=Path, default=None, metavar="JSON", help="print a results file; no GPU")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_interruptible(KIND, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    if args.table is not None:
        return print_table(KIND, args.table, markdown)
    if (refused := cannot_start(KIND, args.json, torch.cuda.is_available(), "profiled kernels")) is not None:
        return refused
    sizes = load_sizes()
    data = dict(
        kind=KIND,
        device=torch.cuda.get_device_name(),
        **versions(),
        preset=str(PRESET.relative_to(ROOT)),
        sizes=sizes,
        dtype="bfloat16",
        steps=args.steps,
        warmup=args.warmup,
        profile_steps=PROFILE_STEPS,
        norm_rule=NORM_RULE,
        complete=False,
        rows=[],
    )
    keep_earlier_run(KIND, args.json)
    own = project_kernels()
    for mode in args.modes:
        for path in args.paths:
            try:
                row = measure(path, mode, sizes, args.steps, args.warmup, own)
            except Exception as e:  # one failing row (a compile error, say) does not lose the others
                row = dict(path=path, mode=mode, error=one_line(e))
            finally:
                torch.compiler.reset()
                torch.cuda.empty_cache()
            data["rows"].append(row)
            print(f"{mode} {path}: " + (row["error"] or f"{row['wall_ms']:.2f} ms/step"), flush=True)
            write_json(args.json, data)  # after every row: an interrupted run keeps what it measured
    data["complete"] = True
    print(markdown(data))
    print(f"wrote {write_json(args.json, data)}")
    return exit_status("transformer_step", sum(r["error"] is not None for r in data["rows"]), "row(s) failed (above)")


if __name__ == "__main__":
    sys.exit(main())
