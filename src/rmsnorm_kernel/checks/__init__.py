"""The checks behind ``python -m rmsnorm_kernel <command>``, one module per command family.

``cli`` parses and prints; ``report`` holds what every command's output shares. ``campaigns`` (the
numeric comparisons with the oracle), ``environment``, ``gradients`` (the oracle's own gradients),
``negative`` (contract refusals, the launch tripwire, the mutants caught), ``exercise``, ``profile``,
``compile_report``, ``checkpoint_audit``, ``figures`` and ``clean`` each back one or more commands
(the inputs, bad inputs, tripwire and broken kernels they share are in ``rmsnorm_kernel.testing``), and
``benchmark`` times the kernels against their peers on a GPU: it is the one home of the implementations
under test, the oracle check, the byte model and the timing of whole calls, which the repository's
``benchmarks`` package (the sweep over hidden sizes, the launch-plan experiments) builds on.
"""
