"""The names of the RMSNorm paths, and of the fallback, that the module and the config accept.

``triton`` is this project's kernels, ``reference`` its readable oracle in PyTorch ops (float32 inside),
``native`` PyTorch's own ``torch.nn.functional.rms_norm``: what a user would run without this project."""

IMPLS = ("triton", "reference", "native")
FALLBACKS = (None, "reference")
