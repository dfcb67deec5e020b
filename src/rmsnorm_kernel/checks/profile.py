"""The ``profile`` command: what one forward and one forward+backward launch, per path, under torch.profiler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..ops.backend import kernel_device_type
from ..ops.counters import call_counts, counting
from ..ops.op import rmsnorm
from ..ops.reference import DEFAULT_EPS, rmsnorm_reference
from ..testing import make_inputs


@dataclass
class ProfileRow:
    path: str
    phase: str
    count: int
    unit: str
    triton_calls: dict[str, int]
    names: dict[str, int] = field(default_factory=dict)
    ok: bool = True
    detail: str = ""


#: Inductor's C++ kernels are visible to the profiler only when compiled with kernel profiling on.
_CPU_KERNEL_MARKERS = ("cpp_fused", "kernel_cpp")

#: ``torch.compile``'s ``options``: Inductor's C++ kernels record themselves in the CPU profile.
KERNEL_PROFILE_OPTIONS = {"cpp.enable_kernel_profile": True}


def compile_profiled(fn):
    """``torch.compile(fn, fullgraph=True)`` with Inductor's C++ kernel profiling on, where this torch's
    Inductor has that option (``torch.compile`` refuses an option it does not know); without it otherwise."""
    try:
        return torch.compile(fn, fullgraph=True, options=KERNEL_PROFILE_OPTIONS)
    except RuntimeError:
        return torch.compile(fn, fullgraph=True)


def _count_events(prof, on_gpu: bool) -> tuple[int, dict[str, int]]:
    from torch.autograd import DeviceType

    names: dict[str, int] = {}
    for evt in prof.events():
        if on_gpu:
            keep = evt.device_type == DeviceType.CUDA and not evt.name.startswith(("Memcpy", "Memset"))
        else:
            keep = evt.device_type == DeviceType.CPU and (
                evt.name.startswith(("aten::", "rmsnorm_kernel::")) or any(m in evt.name for m in _CPU_KERNEL_MARKERS)
            )
        if keep:
            names[evt.name] = names.get(evt.name, 0) + 1
    return sum(names.values()), names


@counting()
def profile_counts(shape: Sequence[int] = (64, 257), device: str | None = None) -> list[ProfileRow]:
    """Kernels (GPU) or operator calls (CPU) of one forward and one forward+backward of each path.

    On the GPU every CUDA kernel the profiler sees is counted (copies and memsets aside). On the CPU
    there are no kernel launches to count; the stand-in is every aten operator call, nested ones
    included, plus Inductor's C++ kernels and the custom op's own entry. Under Triton's interpreter
    the Triton path's count is mostly the interpreter's own tensor bookkeeping.
    Each path runs once unprofiled first, so compilation and autotuning are not counted.
    """
    from torch.profiler import ProfilerActivity, profile

    device = device or kernel_device_type()
    on_gpu = device == "cuda"
    unit = "GPU kernels" if on_gpu else "CPU operator calls"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    x, gamma, dy = make_inputs(tuple(shape), torch.float32, device)
    torch.compiler.reset()
    paths = {
        "reference": rmsnorm_reference,
        "triton": rmsnorm,
        "torch.compile(reference)": compile_profiled(rmsnorm_reference),
    }

    def forward(fn, leaves):
        with torch.no_grad():
            fn(*leaves, DEFAULT_EPS)

    def forward_backward(fn, leaves):
        fn(*leaves, DEFAULT_EPS).backward(dy)

    def leaves_for(phase):  # made outside the profiled region, so that their copies are not counted
        if phase == "forward":
            return x, gamma
        return x.clone().requires_grad_(), gamma.clone().requires_grad_()

    rows = []
    for path, fn in paths.items():
        for phase, step in (("forward", forward), ("forward+backward", forward_backward)):
            step(fn, leaves_for(phase))  # warm-up: compilation, autotuning, lazy initialisation
            leaves = leaves_for(phase)
            if on_gpu:
                torch.cuda.synchronize()
            before = call_counts()
            with profile(activities=activities) as prof:
                step(fn, leaves)
                if on_gpu:
                    torch.cuda.synchronize()
            after = call_counts()
            calls = {k: after[k] - before[k] for k in after}
            count, names = _count_events(prof, on_gpu)
            problems = []
            if count == 0:
                problems.append(f"the profiler recorded no {unit}")
            if path == "triton":
                want = {"forward": 1, "backward": 1 if phase == "forward+backward" else 0}
                if calls != want:
                    problems.append(f"Triton op calls {calls}, expected {want}")
            elif any(calls.values()):
                problems.append(f"the {path} path called the Triton op: {calls}")
            rows.append(ProfileRow(path, phase, count, unit, calls, names, not problems, "; ".join(problems)))
    return rows
