"""Measurements outside the package, each run from the repository root as ``python -m benchmarks.<name>``.

- ``sweep``: the Triton RMSNorm and its peers over hidden sizes, checked against the oracle and timed
  two ways, with a merged report and figure (``python -m benchmarks.sweep``);
- ``launch_rules``, ``launch_sweep``: the launch-plan experiments behind ``rmsnorm_kernel.ops.launch``;
- ``host_time``: the host time per call of the Triton path's pieces at a small shape;
- ``compiled_step``: a training step under ``torch.compile(mode="reduce-overhead")`` on both paths.

Imports go one way: these modules import ``rmsnorm_kernel`` (its ``checks.benchmark`` is the one home of
the implementations under test, the oracle check, the byte model and the timing of whole calls), never
the reverse. ``common`` holds what several of them share.
"""

# First, before any of these modules imports Triton: the package chooses the GPU or Triton's interpreter
# (TRITON_INTERPRET) on import, and Triton reads that choice when it is imported.
import rmsnorm_kernel  # noqa: E402, F401
