"""Measurements outside the package, each run from the repository root as ``python -m benchmarks.<name>``.

- ``benchmark``: the Triton RMSNorm and its peers at nine shapes, checked against the oracle and timed,
  with a table, a JSON file and a figure (``python -m benchmarks.benchmark``);
- ``sweep``: the same over hidden sizes, timed two ways, with a merged report and figure
  (``python -m benchmarks.sweep``);
- ``launch_rules``, ``launch_sweep``: the launch-plan experiments behind ``rmsnorm_kernel.ops.launch``;
- ``host_time``: the host time per call of the Triton path's pieces at a small shape;
- ``train_step``: a training step of the ``model=large`` network on every path, eager and compiled, in
  float32 and bfloat16: wall time, GPU time, kernel launches and the RMSNorm's GPU time;
- ``residual_add``: the fused residual add and norm against compiled and eager add + ``F.rms_norm`` and
  Liger-Kernel's fused add;
- ``transformer_step``: where a training step of ``model=transformer_large`` spends its GPU time, per
  RMSNorm path, eager or compiled.

What they share, one job per module: ``impls`` (the implementations under test and one whole call of
each), ``seed_kernel`` (the one-program-per-row peer), ``rows`` (the byte model, the oracle check, the
check-then-time of one row, the winners),
``timing`` (the timers of whole calls, the copy ceiling), ``figures`` (the benchmark's figure) and
``common`` (command-line parsing, JSON files). Imports go one way: these modules import
``rmsnorm_kernel``, never the reverse.
"""

# First, before any of these modules imports Triton: the package chooses the GPU or Triton's interpreter
# (TRITON_INTERPRET) on import, and Triton reads that choice when it is imported.
import rmsnorm_kernel  # noqa: E402, F401
