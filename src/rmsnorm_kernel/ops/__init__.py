"""The operator: the oracle, the contract, the tolerances, the Triton kernels with their launch plans,
the registered op with its autograd, and the ``RMSNorm`` module. ``rmsnorm_kernel`` re-exports its API."""
