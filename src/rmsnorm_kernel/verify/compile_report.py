"""The ``compile-report`` command: a small network with the Triton RMSNorm under ``torch.compile(fullgraph=True)``.

Checks: no graph break, the custom ops appear in Inductor's generated code as calls (extern, not fused
into an Inductor kernel), and the compiled forward and gradients match eager execution.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.backend import kernel_device_type
from ..ops.module import RMSNorm
from ..ops.op import call_counts
from ..ops.tolerances import compare


@dataclass
class CompileReport:
    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    code_files: list[str]
    op_calls: list[str]  # the generated lines that call the custom ops
    excerpts: list[str]
    max_abs_output: float
    outputs_match: bool
    grads_match: bool
    triton_calls: dict[str, int]
    ok: bool
    problems: list[str]


class SmallNet(torch.nn.Module):
    """Linear -> RMSNorm (Triton path) -> SiLU -> Linear, with a hidden width that is not a power of two."""

    def __init__(self, d_in: int = 16, hidden: int = 257, d_out: int = 4):
        super().__init__()
        self.inp = torch.nn.Linear(d_in, hidden)
        self.norm = RMSNorm(hidden, impl="triton")
        self.out = torch.nn.Linear(hidden, d_out)
        with torch.no_grad():  # a gamma that is not all ones, so that dgamma matters
            self.norm.weight.copy_(1.0 + 0.1 * torch.arange(hidden) / hidden)

    def forward(self, x):
        return self.out(torch.nn.functional.silu(self.norm(self.inp(x))))


#: A call of the custom op from Inductor's wrapper code: an extern call, outside any generated kernel.
OP_CALL = re.compile(r"torch\.ops\.rmsnorm_kernel\.(rmsnorm|rmsnorm_backward)\.default\(")


def op_call_excerpts(code: str, context: int = 3) -> tuple[list[str], list[str]]:
    """The lines that call the custom ops, and each with ``context`` lines around it (``>>`` marks the call)."""
    lines = code.splitlines()
    hits = [i for i, line in enumerate(lines) if OP_CALL.search(line)]
    excerpts = []
    for i in hits:
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        excerpts.append("\n".join(f"{'>>' if j == i else '  '} {lines[j]}" for j in range(lo, hi)))
    return [lines[i].strip() for i in hits], excerpts


def compile_report(code_dir: Path, batch: int = 8, device: str | None = None) -> CompileReport:
    """Compile ``SmallNet`` with ``fullgraph=True``, save Inductor's code to ``code_dir``, locate the custom op."""
    from torch._inductor.utils import run_and_get_code

    device = device or kernel_device_type()
    torch.manual_seed(0)
    net = SmallNet().to(device)
    x = torch.randn(batch, 16, device=device)

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(x)
    reasons = [str(getattr(b, "reason", b)) for b in explanation.break_reasons]
    if explanation.graph_break_count:  # fullgraph=True would raise; report the breaks instead
        problems = [f"{explanation.graph_break_count} graph break(s): {reasons}"]
        return CompileReport(explanation.graph_count, explanation.graph_break_count, reasons, [], [], [], math.nan,
                             False, False, {"forward": 0, "backward": 0}, False, problems)

    eager = net(x)
    eager.sum().backward()
    eager_grads = [p.grad.detach().clone() for p in net.parameters()]
    net.zero_grad()

    compiled = torch.compile(net, fullgraph=True)

    def step(inp):
        out = compiled(inp)
        out.sum().backward()
        return out.detach()

    before = call_counts()
    out, codes = run_and_get_code(step, x)  # resets dynamo first, so this compiles afresh
    after = call_counts()
    calls_made = {k: after[k] - before[k] for k in after}

    code_dir.mkdir(parents=True, exist_ok=True)
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
    for op in ("rmsnorm", "rmsnorm_backward"):
        if not any(f"rmsnorm_kernel.{op}.default(" in line for line in op_calls):
            problems.append(f"torch.ops.rmsnorm_kernel.{op} is not called in the generated code (inlined, fused or missing)")
    if calls_made != {"forward": 1, "backward": 1}:
        problems.append(f"the compiled step called the Triton op {calls_made}, expected one forward and one backward")
    if not c.ok:
        problems.append(f"compiled output differs from eager (max abs {c.max_abs:.3g})")
    if not grads_ok:
        problems.append("compiled gradients differ from eager")
    return CompileReport(
        explanation.graph_count, explanation.graph_break_count, reasons, files, op_calls, excerpts,
        c.max_abs, c.ok, grads_ok, calls_made, not problems, problems,
    )
