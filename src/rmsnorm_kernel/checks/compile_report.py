"""The ``compile-report`` command: the demo network with the Triton RMSNorm under ``torch.compile(fullgraph=True)``.

Checks: no graph break, the Triton path appears in Inductor's generated code (on a GPU as launches of
this package's kernels, which the generated code makes itself; under the interpreter as calls of the
custom ops, which stay opaque there: ``ops/op.py``), and the compiled forward and gradients match eager
execution.

How, through public routes only:

- Graph breaks: ``torch.compile(fullgraph=True)`` raises at the first graph break, so a traced and run
  forward is the proof that there is none. That trace uses a backend that only counts the graphs
  Dynamo hands it, so a failure there is Dynamo's (a break, its reason the exception's first line) and
  not Inductor's.
- Inductor's code: Inductor writes the Python modules it generates (the wrapper that calls the custom
  ops and launches its own kernels) into its cache folder, which the documented environment variable
  ``TORCHINDUCTOR_CACHE_DIR`` names and which Inductor looks up each time it writes there. The compile
  runs with that variable pointing at a fresh temporary folder (the cache variables are restored
  afterwards), so every ``.py`` file in it is code of this compile: the wrappers, and on a GPU
  Inductor's Triton kernels too. They are copied to the report's folder. A fresh folder also
  means no cached result from an earlier compile stands in for compiling.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops import launchers
from ..ops.backend import kernel_device_type
from ..ops.counters import call_counts, counting
from ..ops.reference import DEFAULT_EPS
from ..ops.tolerances import compare
from ..training.network import build_network


@dataclass
class CompileReport:
    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    code_files: list[str]
    op_calls: list[str]  # the generated lines that launch the Triton path's kernels or call its ops
    excerpts: list[str]
    max_abs_output: float
    outputs_match: bool
    grads_match: bool
    triton_calls: dict[str, int]
    ok: bool
    problems: list[str]


#: The compiled network's widths: a hidden width that is not a power of two.
INPUT_DIM, HIDDEN_DIM, OUTPUT_DIM = 16, 257, 4


def demo_network() -> torch.nn.Module:
    """The demo network (``training.network.build_network``) on the Triton path, with a gamma that is not
    all ones, so that dgamma matters."""
    net = build_network(INPUT_DIM, HIDDEN_DIM, OUTPUT_DIM, norm_impl="triton", eps=DEFAULT_EPS)
    with torch.no_grad():
        net.norm.weight.copy_(1.0 + 0.1 * torch.arange(HIDDEN_DIM) / HIDDEN_DIM)
    return net


def _launch_or_call(op: str, kernel_names: tuple[str, ...]) -> re.Pattern:
    # a launch from Inductor's wrapper: ``<kernel>_<n>.run(`` (its copy of a user kernel), or the op called
    kernels_alt = "|".join(kernel_names)
    return re.compile(rf"torch\.ops\.rmsnorm_kernel\.{op}\.default\(|\b(?:{kernels_alt})(?:_\d+)?\.run\(")


#: How the generated code runs each direction of the Triton path: a launch of one of its kernels or a
#: call of its op, outside any kernel Inductor generated (not fused into one).
LAUNCHES = {
    "forward": _launch_or_call("rmsnorm", launchers.FORWARD_KERNELS),
    "backward": _launch_or_call("rmsnorm_backward", launchers.BACKWARD_KERNELS),
}


def op_call_excerpts(code: str, context: int = 3) -> tuple[list[str], list[str]]:
    """The lines that launch the Triton path (``LAUNCHES``), and each with ``context`` lines around it
    (``>>`` marks the line)."""
    lines = code.splitlines()
    hits = [i for i, line in enumerate(lines) if any(p.search(line) for p in LAUNCHES.values())]
    excerpts = []
    for i in hits:
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        excerpts.append("\n".join(f"{'>>' if j == i else '  '} {lines[j]}" for j in range(lo, hi)))
    return [lines[i].strip() for i in hits], excerpts


#: The environment variables Inductor reads for its cache folders; it sets ``TRITON_CACHE_DIR`` itself,
#: inside its cache folder, when it compiles Triton kernels.
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

#: How the temporary cache folder of a compile is named.
TEMP_PREFIX = "rmsnorm_kernel_inductor_"


@contextlib.contextmanager
def inductor_cache_dir(path: Path):
    """Inductor's cache folder is ``path`` (``TORCHINDUCTOR_CACHE_DIR``) inside the block; the cache
    variables are as they were after it, so that no later compile writes into ``path``."""
    saved = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def generated_code(cache_dir: Path) -> list[str]:
    """The Python modules Inductor wrote into ``cache_dir``, oldest first (the forward's before the backward's)."""
    files = sorted(cache_dir.rglob("*.py"), key=lambda p: (p.stat().st_mtime_ns, str(p)))
    return [p.read_text() for p in files]


def count_graphs(graphs: list):
    """A ``torch.compile`` backend that records each graph Dynamo captures and runs it as it is."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


@counting()
def compile_report(code_dir: Path, batch: int = 8, device: str | None = None) -> CompileReport:
    """Compile ``demo_network()`` with ``fullgraph=True``, save Inductor's code to ``code_dir``, locate the
    custom op."""
    device = device or kernel_device_type()
    torch.manual_seed(0)
    net = demo_network().to(device)
    x = torch.randn(batch, INPUT_DIM, device=device)

    graphs: list = []
    torch.compiler.reset()
    try:
        torch.compile(net, fullgraph=True, backend=count_graphs(graphs))(x)
    except Exception as e:  # noqa: BLE001 - fullgraph=True raises at the first graph break
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        problems = [f"graph break (torch.compile(fullgraph=True) refused the network): {reason}"]
        return CompileReport(
            len(graphs), 1, [reason], [], [], [], math.nan, False, False, {"forward": 0, "backward": 0}, False, problems
        )

    eager = net(x)
    eager.sum().backward()
    eager_grads = [p.grad.detach().clone() for p in net.parameters()]
    net.zero_grad()

    torch.compiler.reset()  # compile afresh, with Inductor
    compiled = torch.compile(net, fullgraph=True)
    before = call_counts()
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp, inductor_cache_dir(Path(tmp)):
        out = compiled(x)
        out.sum().backward()
        out = out.detach()
        codes = generated_code(Path(tmp))
    after = call_counts()
    calls_made = {k: after[k] - before[k] for k in after}

    code_dir.mkdir(parents=True, exist_ok=True)
    for stale in code_dir.glob("inductor_output_*.py"):
        stale.unlink()
    files, op_calls, excerpts = [], [], []
    for i, code in enumerate(codes):
        path = code_dir / f"inductor_output_{i}.py"
        path.write_text(code)
        files.append(str(path))
        calls, ex = op_call_excerpts(code)
        op_calls += calls
        excerpts += [f"{path.name}:\n{e}" for e in ex]

    c = compare(out, eager.detach())
    grads_ok = all(compare(p.grad, g).ok for p, g in zip(net.parameters(), eager_grads))
    problems = []
    if not codes:
        problems.append("Inductor produced no code to inspect")
    for direction, pattern in LAUNCHES.items():
        if not any(pattern.search(line) for line in op_calls):
            problems.append(
                f"the generated code neither launches a {direction} kernel of the Triton path nor calls its op "
                "(inlined, fused or missing)"
            )
    if calls_made != {"forward": 1, "backward": 1}:
        problems.append(f"the compiled step called the Triton op {calls_made}, expected one forward and one backward")
    if not c.ok:
        problems.append(f"compiled output differs from eager (max abs {c.max_abs:.3g})")
    if not grads_ok:
        problems.append("compiled gradients differ from eager")
    return CompileReport(
        len(graphs),
        0,
        [],
        files,
        op_calls,
        excerpts,
        c.max_abs,
        c.ok,
        grads_ok,
        calls_made,
        not problems,
        problems,
    )
