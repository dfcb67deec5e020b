"""A training step of the ``model=large`` network on every RMSNorm path, eager and compiled, in float32 and
bfloat16: its wall time, its GPU time, its kernel launches and the RMSNorm's share of the GPU time.

The network is the training preset's: ``build_network(input_dim, hidden_dim, output_dim, norm_impl, eps)``
(Linear -> RMSNorm -> SiLU -> Linear) with the sizes, the learning rate and the rows per step
(``data.batch_size``) read from ``conf/model/large.yaml``, MSE loss and Adam, in a plain loop (no
Lightning) on one fixed random batch. Every row starts from the same seed, so every path starts from the
same weights and batch. A step is ``zero_grad``, the loss, ``backward`` and ``Adam.step``.

Paths (``--paths``): ``reference``, ``native`` (``F.rms_norm``) and ``triton``, the values of
``RMSNorm(impl=...)``, and ``liger`` where ``liger_kernel`` imports: the network's norm replaced by
``LigerRMSNorm`` with the op benchmark's settings (``impls.LIGER_SETTINGS``) and the same weight.

Modes (``--modes``): ``eager``; ``compile``, ``torch.compile`` of the loss function (the network's forward
and the MSE; the backward goes through AOTAutograd); ``reduce-overhead``, the same with
``mode="reduce-overhead"``, whose forward and backward graphs are replayed as CUDA graphs. Adam stays
eager in every row, the same code on every path, so differences between paths are the network's.

Dtypes (``--dtypes``): ``float32``, and ``bfloat16``: the whole network, its weights and the batch in
bfloat16, as ``trainer.precision=bf16-true`` runs it.

Per row, after ``--warmup`` steps (compilation and CUDA-graph recording happen there):

- wall ms/step: the median of ``--steps`` single steps, each timed with ``time.perf_counter`` from an
  idle GPU (``torch.cuda.synchronize`` before) to the end of its GPU work (``synchronize`` after). This
  is what a loop that waits for every step (to read its loss, say) sees: the host work that the GPU does
  not overlap is included, and removing it is what ``reduce-overhead`` is for. CUDA events around the
  step would show nearly the same, but how much host time they include depends on where in the queue
  they land; the host clock around a synchronised step needs no such reasoning.
- host ms/step: the median host time of the same steps, from the start until the step's call returns
  with its work queued. A step is bound by the GPU when its GPU time is well above this.
- GPU ms/step and kernels/step: ``torch.profiler`` over ``PROFILE_STEPS`` more steps, the summed
  durations and the number of the device's kernels (copies and memsets apart), divided by the steps.
- RMSNorm GPU ms/step: the profiled kernels that ``norm_kernel`` identifies by name as the norm's, per
  step. The norm's alone: the Triton path's kernels (those of ``rmsnorm_kernel/ops/kernels.py``),
  Liger's (``_rms_norm_*``) and aten's fused RMSNorm, which runs layer-norm kernels with an RMS flag
  (``vectorized_layer_norm_kernel``, ``layer_norm_grad_input_kernel``, ``GammaBetaBackward...``; the
  network has no layer norm). Compiled rows of the reference and native paths run kernels that Inductor
  generates and names after the ops fused into them (``triton_red_fused_add_mean_mul_pow_rsqrt_silu_0``);
  ``rsqrt``, ``pow``, ``mean`` and ``rms_norm`` come from the norm alone in this network (the MSE is named
  ``mse_loss``, the SiLU ``silu``), so a generated kernel naming one of them holds the norm and whatever
  Inductor fused with it, the SiLU's forward or backward: such numbers are marked as including fused
  neighbours. Not counted, for want of a name: the eager reference's generic aten kernels (``pow``,
  ``mean``, ``mul``, ...: no number at all there), and the last column sum of dgamma where it is a
  generic aten ``sum`` (Liger's over its per-SM partials; Inductor's over the workspace of its mixed-order
  reduction), a few microseconds a step. Each row's JSON lists every kernel with its time and verdict,
  so the rule can be checked against the profile.
- ``rmsnorm_kernel.call_counts()`` over K = ``--steps`` more steps inside ``counting()``, after the timed
  ones (counting is off while steps are timed; the compiled modes recompile for it): the Triton path must
  show K forward and K backward calls in every mode and the other paths none. The command exits 1 when a
  count differs.

    python -m benchmarks.train_step [--steps N] [--warmup N] [--dtypes float32,bfloat16]
        [--paths reference,native,triton,liger] [--modes eager,compile,reduce-overhead] [--rows N] [--json PATH]
    python -m benchmarks.train_step --table outputs/train_step.json   # the results as a Markdown table

The table goes to stdout, the results to ``outputs/train_step.json`` (``--json``). Needs a CUDA GPU:
without one it says so in one line and exits 2 (``--table`` needs none).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from rmsnorm_kernel import tables
from rmsnorm_kernel.checks.report import one_line
from rmsnorm_kernel.ops.impls import IMPLS

from . import impls
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
from .impls import EPS, LIGER_SETTINGS, versions

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "model" / "large.yaml"
DEFAULT_JSON = Path("outputs") / "train_step.json"
KIND = "train_step"

#: The RMSNorm module's paths (``IMPLS``) in the tables' order, and Liger-Kernel's module where installed.
PATHS = (*sorted(IMPLS, key=("reference", "native", "triton").index), "liger")
MODES = ("eager", "compile", "reduce-overhead")
DTYPES = {name: impls.DTYPES[name] for name in ("float32", "bfloat16")}
PROFILE_STEPS = 5
SEED = 0

#: Ops that only the RMSNorm brings into this network: an Inductor kernel whose name lists one holds the norm.
NORM_OPS = frozenset({"rsqrt", "pow", "mean"})
#: Kernels of a norm by their own names: Liger's (``_rms_norm_forward_kernel``, ...) and those of aten's
#: fused RMSNorm, which are its layer-norm kernels (there is no layer norm in this network).
NORM_NAME = re.compile(
    r"rms_?norm|layer_?norm|GammaBeta|RowwiseMoments|ComputeInternalGradients|ComputeGradientFusedParams",
    re.IGNORECASE,
)
NORM_RULE = (
    "own: a kernel of rmsnorm_kernel/ops/kernels.py (name prefix), or a name matching " + NORM_NAME.pattern + " "
    "(Liger's, aten's fused RMSNorm); fused: an Inductor kernel triton_{poi,per,red,tem}_fused_<ops> whose ops "
    "include rsqrt, pow, mean or rms_norm, with what it fused (the SiLU)"
)
#: The kernels Inductor generates: ``triton_`` + pointwise, persistent or looped reduction, template.
INDUCTOR_NAME = re.compile(r"^triton_(poi|per|red|tem)_fused_(?P<ops>.+?)(_\d+)?$")


# --------------------------------------------------------------------------------------------------
# What is measured


def load_sizes(path: Path = PRESET) -> dict:
    """The network's sizes, learning rate and rows per step from a model preset (``model:`` and ``data:``
    keys, as ``conf/model/large.yaml`` holds them)."""
    try:
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except ImportError:  # the training extra is not installed: the preset is plain YAML
        import yaml

        cfg = yaml.safe_load(Path(path).read_text())
    model, data = cfg["model"], cfg["data"]
    return dict(
        input_dim=int(model["input_dim"]),
        hidden_dim=int(model["hidden_dim"]),
        output_dim=int(model["output_dim"]),
        lr=float(model["lr"]),
        batch_size=int(data["batch_size"]),
    )


def liger_available() -> bool:
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm  # noqa: F401
    except Exception:  # not installed, or it fails to import on this machine
        return False
    return True


def liger_norm(norm: torch.nn.Module) -> torch.nn.Module:
    """A ``LigerRMSNorm`` in place of the project's ``norm``: same size, eps and weight, followed by the
    norm's activation as a separate layer (Liger has no norm with an activation)."""
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    s = LIGER_SETTINGS
    liger = LigerRMSNorm(
        norm.weight.shape[0], eps=norm.eps, offset=s["offset"], casting_mode=s["casting_mode"], in_place=s["in_place"]
    )
    with torch.no_grad():
        liger.weight.copy_(norm.weight)
    return torch.nn.Sequential(liger, torch.nn.SiLU()) if norm.activation == "silu" else liger


def make_step(path: str, mode: str, dtype: torch.dtype, sizes: dict, device: str) -> Callable[[], torch.Tensor]:
    """One training step of a fresh network and optimiser on a fixed batch, seeded alike on every path;
    returns the loss (under ``reduce-overhead`` a CUDA graph's output, valid until the next step)."""
    from rmsnorm_kernel.training.network import build_network

    torch.manual_seed(SEED)  # the Linear layers draw their weights; no norm draws anything
    model = build_network(
        input_dim=sizes["input_dim"],
        hidden_dim=sizes["hidden_dim"],
        output_dim=sizes["output_dim"],
        norm_impl="reference" if path == "liger" else path,
        eps=EPS,
    )
    if path == "liger":
        model.norm = liger_norm(model.norm)
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=sizes["lr"])
    g = torch.Generator(device=device).manual_seed(SEED)
    # drawn in float32 and rounded, as a float32 data loader's batch reaches a bf16-true model
    x = torch.randn(sizes["batch_size"], sizes["input_dim"], device=device, generator=g).to(dtype)
    target = torch.randn(sizes["batch_size"], sizes["output_dim"], device=device, generator=g).to(dtype)

    def loss_fn(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(model(x), target)

    if mode != "eager":
        torch.compiler.reset()  # each row compiles from a clean cache
        loss_fn = torch.compile(loss_fn, mode="reduce-overhead" if mode == "reduce-overhead" else None)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)  # the last step's gradients (graph outputs) go before the replay
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be overwritten
        loss = loss_fn(x, target)
        loss.backward()
        opt.step()
        return loss

    return step


def wall_times(step: Callable[[], object], steps: int) -> tuple[list[float], list[float]]:
    """Seconds of each of ``steps`` steps, each from an idle GPU to the end of its work, and of the host's
    part of each: until the step's call returns, its work queued."""
    times, host = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, host


def profile_kernels(step: Callable[[], object], steps: int) -> list[tuple[str, float]]:
    """(name, microseconds) of every device activity in ``steps`` steps, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return device_activity(prof.events())


def device_activity(events) -> list[tuple[str, float]]:
    """(name, microseconds) of the profiler's events that ran on the GPU: kernels, copies, memsets.

    The profiler also draws ``record_function`` ranges on the GPU's timeline ("Optimizer.step#Adam.step"
    spans Adam's kernels): user annotations, left out, or their kernels would count twice."""
    from torch.profiler import DeviceType

    return [
        (e.name, e.time_range.elapsed_us())
        for e in events
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]


def project_kernels() -> tuple[str, ...]:
    """The names of the Triton path's kernels, as ``launchers.py`` lists them."""
    from rmsnorm_kernel.ops import launchers

    return launchers.FORWARD_KERNELS + launchers.BACKWARD_KERNELS


def norm_kernel(name: str, own: Iterable[str]) -> str | None:
    """Whether the device kernel ``name`` computes the RMSNorm: ``"own"`` for a kernel of a norm alone (one
    of ``own``, the Triton path's, possibly with a suffix that ``torch.compile`` adds; Liger's; aten's),
    ``"fused"`` for a kernel Inductor generated with a norm op among those it fused, None otherwise."""
    generated = INDUCTOR_NAME.match(name)
    if generated:
        ops = generated["ops"]
        return "fused" if NORM_OPS & set(ops.split("_")) or "rms_norm" in ops else None
    if any(name.startswith(k) for k in own) or NORM_NAME.search(name):
        return "own"
    return None


def is_copy(name: str) -> bool:
    """A copy or a memset: device activity that is no kernel launch."""
    return name.startswith(("Memcpy", "Memset"))


def summarize(events: list[tuple[str, float]], steps: int, own: Iterable[str]) -> dict:
    """Per step: the kernels' GPU time (ms) and count, the norm's GPU time (None: no kernel identifies
    it) and whether that includes fused neighbours; and every kernel by name, longest first."""
    own = tuple(own)
    kernels = [(n, us) for n, us in events if not is_copy(n)]
    by_name: dict[str, list[float]] = {}
    for n, us in kernels:
        by_name.setdefault(n, []).append(us)
    table = [
        dict(name=n, us_per_step=sum(v) / steps, per_step=len(v) / steps, norm=norm_kernel(n, own))
        for n, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    ]
    norm = [k for k in table if k["norm"] is not None]
    return dict(
        gpu_ms=sum(us for _, us in kernels) / steps / 1e3,
        kernels_per_step=len(kernels) / steps,
        copies_per_step=(len(events) - len(kernels)) / steps,
        norm_gpu_ms=sum(k["us_per_step"] for k in norm) / 1e3 if norm else None,
        norm_fused=any(k["norm"] == "fused" for k in norm),
        kernels=table,
    )


def count_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in before}


def expected_calls(path: str, k: int) -> dict[str, int]:
    n = k if path == "triton" else 0
    return {"forward": n, "backward": n}


def measure(
    path: str, mode: str, dtype_name: str, sizes: dict, steps: int, warmup: int, own: tuple, device: str = "cuda"
) -> dict:
    """One row: warm-up, timed steps between two reads of the call counters, profiled steps."""
    from rmsnorm_kernel import call_counts, counting

    step = make_step(path, mode, DTYPES[dtype_name], sizes, device)
    first_loss = float(step().detach())  # read at once: a later replay would overwrite it
    for _ in range(warmup - 1):
        step()
    times, host = wall_times(step, steps)
    profile = summarize(profile_kernels(step, PROFILE_STEPS), PROFILE_STEPS, own)
    with counting():  # steps of their own: counting is off while steps are timed (torch.compile recompiles)
        before = call_counts()
        for _ in range(steps):
            step()
        calls = count_delta(before, call_counts())
    last_loss = float(step().detach())
    return dict(
        path=path,
        mode=mode,
        dtype=dtype_name,
        wall_ms=statistics.median(times) * 1e3,
        wall_min_ms=min(times) * 1e3,
        host_ms=statistics.median(host) * 1e3,
        **profile,
        calls=calls,
        calls_ok=calls == expected_calls(path, steps),
        first_loss=first_loss,
        last_loss=last_loss,
        error=None,
    )


# --------------------------------------------------------------------------------------------------
# Tables


def _ms(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _norm_ms(r: dict) -> str:
    return _ms(r["norm_gpu_ms"]) + ("*" if r["norm_fused"] and r["norm_gpu_ms"] is not None else "")


def _per_step(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def _calls(r: dict) -> str:
    return f"{r['calls']['forward']}/{r['calls']['backward']}" + ("" if r["calls_ok"] else " WRONG")


HEADERS = (
    "path",
    "mode",
    "dtype",
    "wall ms/step",
    "host ms/step",
    "GPU ms/step",
    "kernels/step",
    "RMSNorm GPU ms/step",
)


def row_cells(r: dict) -> tuple:
    if r["error"] is not None:
        return (r["path"], r["mode"], r["dtype"], r["error"], "", "", "", "")
    return (
        r["path"],
        r["mode"],
        r["dtype"],
        _ms(r["wall_ms"]),
        _ms(r.get("host_ms")),
        _ms(r["gpu_ms"]),
        _per_step(r["kernels_per_step"]),
        _norm_ms(r),
    )


FOOTNOTES = (
    "*: Inductor's generated kernels that contain the norm, with what it fused into them (the SiLU)",
    "–: the norm runs as generic aten kernels (pow, mean, mul, ...) that no kernel name tells apart",
)


def footnotes(rows: list[dict]) -> list[str]:
    """The footnotes that the norm column of ``rows`` uses."""
    done = [r for r in rows if r["error"] is None]
    fused = any(r["norm_fused"] and r["norm_gpu_ms"] is not None for r in done)
    unnamed = any(r["norm_gpu_ms"] is None for r in done)
    return [note for note, used in zip(FOOTNOTES, (fused, unnamed)) if used]


def describe(data: dict) -> str:
    """One sentence: the network, the step, the machine and software, how many steps."""
    s = data["sizes"]
    liger = f", Liger {data['liger_kernel']}" if data.get("liger_kernel") else ""
    return (
        f"Training step of the `model=large` network (Linear({s['input_dim']}, {s['hidden_dim']}) -> "
        f"RMSNorm -> SiLU -> Linear({s['hidden_dim']}, {s['output_dim']}), {s['batch_size']} rows, MSE, Adam eager) "
        f"on {data['device']}, torch {data['torch']}, Triton {data['triton']}{liger}; "
        f"wall: median of {data['steps']} steps; GPU: torch.profiler over {data['profile_steps']} steps"
    )


def markdown(data: dict) -> str:
    """The results of a run (its JSON) as a Markdown table for the README, with its footnotes."""
    rows = [(*row_cells(r), "" if r["error"] is not None else _calls(r)) for r in data["rows"]]
    lines = [describe(data) + ".", "", tables.table((*HEADERS, "calls fwd/bwd"), rows, markdown=True)]
    for note in footnotes(data["rows"]):
        lines += ["", note + "."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m benchmarks.train_step", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--steps", type=at_least(1), default=100, help="timed steps per row (default 100)")
    parser.add_argument(
        "--warmup", type=at_least(1), default=10, help="steps before timing, compilation included (default 10)"
    )
    parser.add_argument("--dtypes", type=comma_choices("dtype", DTYPES), default=list(DTYPES), help="default: all")
    parser.add_argument(
        "--paths", type=comma_choices("path", PATHS), default=None, help="default: all (liger where it imports)"
    )
    parser.add_argument("--modes", type=comma_choices("mode", MODES), default=list(MODES), help="default: all")
    parser.add_argument(
        "--rows", type=at_least(1), default=None, help="rows per step (default: the preset's data.batch_size)"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    parser.add_argument(
        "--table", type=Path, default=None, metavar="JSON", help="print a run's results as a Markdown table; no GPU"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_interruptible(KIND, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    if args.table is not None:
        return print_table(KIND, args.table, markdown)
    if (
        refused := cannot_start(KIND, args.json, torch.cuda.is_available(), "profiled kernels, CUDA graphs")
    ) is not None:
        return refused
    try:
        sizes = load_sizes(PRESET)
    except Exception as e:
        print(f"{KIND}: {PRESET}: {one_line(e)}", file=sys.stderr)
        return 2
    if args.rows is not None:
        sizes["batch_size"] = args.rows
    has_liger = liger_available()
    paths = args.paths
    if paths is None:
        paths = [p for p in PATHS if p != "liger" or has_liger]
    elif "liger" in paths and not has_liger:
        print(f"{KIND}: --paths liger: liger_kernel does not import here; accepted: the other paths", file=sys.stderr)
        return 2

    v = versions()
    data = dict(
        kind=KIND,
        device=torch.cuda.get_device_name(),
        **v,
        preset=str(PRESET.relative_to(ROOT)),
        sizes=sizes,
        eps=EPS,
        liger_settings=LIGER_SETTINGS if "liger" in paths else None,
        optimizer=f"Adam(lr={sizes['lr']}), eager",
        steps=args.steps,
        warmup=args.warmup,
        profile_steps=PROFILE_STEPS,
        timing="perf_counter around one step between two torch.cuda.synchronize(), median",
        gpu_time="torch.profiler: device kernels' summed durations / steps",
        norm_rule=NORM_RULE,
        complete=False,
        rows=[],
    )
    print(describe(data))
    if not has_liger:
        print("liger: liger_kernel does not import here; no liger rows")
    keep_earlier_run(KIND, args.json)
    own = project_kernels()
    for dtype_name in args.dtypes:
        for mode in args.modes:
            for path in paths:  # innermost: the paths of one mode and dtype run back to back
                try:
                    row = measure(path, mode, dtype_name, sizes, args.steps, args.warmup, own)
                except Exception as e:  # one failing row (a compile error, say) does not lose the others
                    row = dict(path=path, mode=mode, dtype=dtype_name, error=one_line(e), calls_ok=False)
                    row["traceback"] = traceback.format_exc()[-4000:]  # the table has one line; the file keeps more
                finally:
                    torch.compiler.reset()
                    torch.cuda.empty_cache()
                data["rows"].append(row)
                print(f"{dtype_name} {mode} {path}: " + (row["error"] or f"{row['wall_ms']:.3f} ms/step"), flush=True)
                write_json(args.json, data)  # after every row: an interrupted run keeps what it measured
    data["complete"] = True
    print()
    print(
        tables.table(
            (*HEADERS, f"calls fwd/bwd in {args.steps} steps"),
            [(*row_cells(r), "" if r["error"] is not None else _calls(r)) for r in data["rows"]],
            right=(3, 4, 5, 6),
            groups=[(r["dtype"], r["mode"]) for r in data["rows"]],
        )
    )
    for note in footnotes(data["rows"]):
        print(note)
    print(f"wrote {write_json(args.json, data)}")
    miscounted = sum(not r["calls_ok"] for r in data["rows"])
    return exit_status("train_step", miscounted, "row(s) whose Triton call counts are not the steps' (the table)")


if __name__ == "__main__":
    sys.exit(main())
