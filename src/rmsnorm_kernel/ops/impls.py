"""The names of the two RMSNorm paths, and of the fallback, that the module and the config accept."""

IMPLS = ("triton", "reference")
FALLBACKS = (None, "reference")
