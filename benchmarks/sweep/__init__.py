"""The sweep over hidden sizes, run as ``python -m benchmarks.sweep`` from the repository root.

One job per module, imports in one direction: ``points`` (which points, their split and hash) ←
``measure`` (checking and timing one point, the copy ceiling) ← ``report`` (merging run files, worst
ratios, noise, targets, the markdown) ← ``figures`` (the PNG) ← ``run`` (the command) ← ``__main__``.
"""
