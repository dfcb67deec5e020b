"""The checks behind ``python -m rmsnorm_kernel <command>``, one module per command family.

``main`` is the program (its parser and argument checks), ``commands`` what each command runs, prints
and writes, ``cli`` the command-line layer it shares with the benchmarks (exit statuses, one-line usage
errors, signals); ``report`` holds what every command's report shares. ``campaigns`` (the
numeric comparisons with the oracle), ``environment``, ``gradients`` (the oracle's own gradients),
``negative`` (contract refusals, the launch tripwire, the mutants caught), ``exercise``, ``profile``,
``compile_report``, ``checkpoint_audit``, ``figures`` and ``clean`` each back one or more commands
(the inputs, bad inputs, tripwire and broken kernels they share are in ``rmsnorm_kernel.testing``).
Timing the kernels is no check: it lives outside the package, in the repository's ``benchmarks``
(``python -m benchmarks.benchmark``).
"""
