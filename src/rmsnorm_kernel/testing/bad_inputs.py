"""The contract's bad inputs: every input the Triton path must refuse, named once for the tests and the
``negative`` command.

Each ``Violation`` builds ``(x, gamma, eps)`` on a device, and the keyword arguments passed with them
(``kwargs``: activation, mode, residual, residual_in_fp32), names the argument at fault (as the refusal
names it first: ``x``, ``gamma``, ``eps``, ``activation``, ``mode``, ``residual``, ``residual_in_fp32``,
or ``x and gamma``) and holds a pattern that the message of the
``ContractError`` must match. An x without rows is no violation by itself (it gives an empty y without a
launch), but it is checked for everything else: the ``no_rows_*`` cases are refused for their other
fault. Rows of zero elements (N = 0) are a violation, reported before gamma's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..ops.contract import MAX_N
from ..ops.reference import ACTIVATIONS, MODES

_DTYPES = r"float32, float16, bfloat16 or float64"
_EPS = r"a finite number > 0"
_ACTIVATIONS = re.escape(" or ".join(map(repr, ACTIVATIONS)))
_MODES = re.escape(" or ".join(map(repr, MODES)))


@dataclass(frozen=True)
class Violation:
    """An input the Triton path must refuse: ``rmsnorm(*build(device), **kwargs(device))``; the refusal
    names ``argument`` and matches the pattern ``message``."""

    name: str
    argument: str
    build: Callable[[str], tuple]
    message: str
    kwargs: Callable[[str], dict] = lambda d: {}

    def problems(self, refusal: str) -> list[str]:
        """Why ``refusal`` (a ContractError's message) is not this violation's: [] when it names the
        argument first and matches the pattern."""
        found = []
        named = refusal.split(": ", 1)[-1]
        if not named.startswith(f"{self.argument} "):
            found.append(f"the message does not name {self.argument!r} first: {refusal}")
        if not re.search(self.message, refusal):
            found.append(f"message does not match /{self.message}/: {refusal}")
        return found


def _x_and_gamma(shape, d, gamma_shape=None, dtype=torch.float32, gamma_dtype=None):
    x = torch.randn(shape, device=d, dtype=dtype)
    return x, torch.ones(gamma_shape or shape[-1], device=d, dtype=gamma_dtype or dtype)


CONTRACT_VIOLATIONS: tuple[Violation, ...] = (
    # not tensors
    Violation(
        "x_not_tensor",
        "x",
        lambda d: ([[1.0, 2.0]], torch.ones(2, device=d), 1e-6),
        r"x is a list; accepted: a torch\.Tensor",
    ),
    Violation(
        "gamma_not_tensor",
        "gamma",
        lambda d: (torch.randn(4, 2, device=d), [1.0, 1.0], 1e-6),
        r"gamma is a list; accepted: a torch\.Tensor",
    ),
    # dtypes
    Violation(
        "x_complex64",
        "x",
        lambda d: (*_x_and_gamma((4, 6), d, dtype=torch.complex64), 1e-6),
        rf"x has dtype torch\.complex64; accepted: {_DTYPES}",
    ),
    Violation(
        "x_int32",
        "x",
        lambda d: (torch.ones(4, 6, device=d, dtype=torch.int32), torch.ones(6, device=d), 1e-6),
        rf"x has dtype torch\.int32; accepted: {_DTYPES}",
    ),
    Violation(
        "gamma_complex64",
        "gamma",
        lambda d: (*_x_and_gamma((4, 6), d, gamma_dtype=torch.complex64), 1e-6),
        rf"gamma has dtype torch\.complex64; accepted: {_DTYPES}",
    ),
    # devices
    Violation(
        "devices_differ",
        "x and gamma",
        lambda d: (torch.randn(4, 6, device=d), torch.ones(6, device="meta"), 1e-6),
        r"x and gamma are on .* and meta; accepted: both on the same device",
    ),
    Violation(
        "device_not_served",
        "x",
        lambda d: (*_x_and_gamma((4, 6), "meta"), 1e-6),
        r"x is on meta; accepted: (cpu|cuda) tensors",
    ),
    # shapes
    Violation(
        "x_0d",
        "x",
        lambda d: (torch.tensor(1.0, device=d), torch.ones(1, device=d), 1e-6),
        r"x is a 0-d tensor; accepted: a tensor of shape \(\.\.\., N\)",
    ),
    Violation(
        "x_rows_of_zero_elements",
        "x",
        lambda d: (*_x_and_gamma((4, 0), d), 1e-6),
        rf"x has rows of N = 0 elements \(shape \(4, 0\)\); "
        rf"accepted: 1 <= N <= {MAX_N} \(x may have zero rows, but not rows of zero elements\)",
    ),
    Violation(
        "x_no_rows_of_zero_elements",
        "x",
        lambda d: (*_x_and_gamma((0, 0), d), 1e-6),
        r"x has rows of N = 0 elements \(shape \(0, 0\)\)",
    ),
    Violation(
        "x_1d_of_zero_elements",
        "x",
        lambda d: (*_x_and_gamma((0,), d), 1e-6),
        r"x has rows of N = 0 elements \(shape \(0,\)\)",
    ),
    Violation(
        # N = 0 is named, not gamma: asking for a gamma of shape (0,) would lead to the next refusal
        "x_rows_of_zero_elements_with_a_longer_gamma",
        "x",
        lambda d: (*_x_and_gamma((4, 0), d, gamma_shape=6), 1e-6),
        r"x has rows of N = 0 elements \(shape \(4, 0\)\)",
    ),
    Violation(
        "gamma_wrong_length",
        "gamma",
        lambda d: (*_x_and_gamma((4, 6), d, gamma_shape=7), 1e-6),
        r"gamma has shape \(7,\); accepted: shape \(6,\), the last dimension of x",
    ),
    Violation(
        "gamma_2d",
        "gamma",
        lambda d: (*_x_and_gamma((4, 6), d, gamma_shape=(1, 6)), 1e-6),
        r"gamma has shape \(1, 6\); accepted: shape \(6,\)",
    ),
    Violation(
        "n_too_large",
        "x",
        lambda d: (*_x_and_gamma((2, MAX_N + 1), d), 1e-6),
        rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
    ),
    # eps
    Violation("eps_zero", "eps", lambda d: (*_x_and_gamma((4, 6), d), 0.0), rf"eps is 0\.0; accepted: {_EPS}"),
    Violation("eps_negative", "eps", lambda d: (*_x_and_gamma((4, 6), d), -1e-6), rf"eps is -1e-06; accepted: {_EPS}"),
    Violation("eps_nan", "eps", lambda d: (*_x_and_gamma((4, 6), d), float("nan")), rf"eps is nan; accepted: {_EPS}"),
    Violation("eps_inf", "eps", lambda d: (*_x_and_gamma((4, 6), d), float("inf")), rf"eps is inf; accepted: {_EPS}"),
    Violation("eps_bool", "eps", lambda d: (*_x_and_gamma((4, 6), d), True), rf"eps is True; accepted: {_EPS}"),
    Violation("eps_str", "eps", lambda d: (*_x_and_gamma((4, 6), d), "1e-6"), rf"eps is '1e-6'; accepted: {_EPS}"),
    # activation
    Violation(
        "activation_unknown",
        "activation",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        rf"activation is 'gelu'; accepted: {_ACTIVATIONS}",
        lambda d: {"activation": "gelu"},
    ),
    # mode
    Violation(
        "mode_unknown",
        "mode",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        rf"mode is 'qwen'; accepted: {_MODES}",
        lambda d: {"mode": "qwen"},
    ),
    Violation(
        "mode_none",
        "mode",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        rf"mode is None; accepted: {_MODES}",
        lambda d: {"mode": None},
    ),
    # residual
    Violation(
        "residual_not_tensor",
        "residual",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        r"residual is a float; accepted: a torch\.Tensor of x's shape",
        lambda d: {"residual": 1.0},
    ),
    Violation(
        "residual_wrong_shape",
        "residual",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        r"residual has shape \(1, 6\); accepted: x's shape, \(4, 6\)",
        lambda d: {"residual": torch.ones(1, 6, device=d)},
    ),
    Violation(
        "residual_complex64",
        "residual",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        rf"residual has dtype torch\.complex64; accepted: {_DTYPES}",
        lambda d: {"residual": torch.ones(4, 6, device=d, dtype=torch.complex64)},
    ),
    Violation(
        "residual_on_meta",
        "residual",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        r"residual is on meta; accepted: x's device",
        lambda d: {"residual": torch.ones(4, 6, device="meta")},
    ),
    Violation(
        "residual_in_fp32_without_a_residual",
        "residual_in_fp32",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        r"residual_in_fp32 is True without a residual; accepted: False, or a residual tensor",
        lambda d: {"residual_in_fp32": True},
    ),
    Violation(
        "residual_in_fp32_not_bool",
        "residual_in_fp32",
        lambda d: (*_x_and_gamma((4, 6), d), 1e-6),
        r"residual_in_fp32 is 1; accepted: True or False",
        lambda d: {"residual": torch.ones(4, 6, device=d), "residual_in_fp32": 1},
    ),
    # an x without rows, refused for its other fault
    Violation(
        "no_rows_residual_in_fp32_not_bool",
        "residual_in_fp32",
        lambda d: (*_x_and_gamma((2, 0, 6), d), 1e-6),
        r"residual_in_fp32 is 'yes'; accepted: True or False",
        lambda d: {"residual": torch.ones(2, 0, 6, device=d), "residual_in_fp32": "yes"},
    ),
    Violation(
        "no_rows_residual_wrong_shape",
        "residual",
        lambda d: (*_x_and_gamma((0, 6), d), 1e-6),
        r"residual has shape \(1, 6\); accepted: x's shape, \(0, 6\)",
        lambda d: {"residual": torch.ones(1, 6, device=d)},
    ),
    Violation(
        "no_rows_mode_unknown",
        "mode",
        lambda d: (*_x_and_gamma((0, 6), d), 1e-6),
        rf"mode is 'Llama'; accepted: {_MODES}",
        lambda d: {"mode": "Llama"},
    ),
    Violation(
        "no_rows_activation_unknown",
        "activation",
        lambda d: (*_x_and_gamma((0, 6), d), 1e-6),
        rf"activation is 'SiLU'; accepted: {_ACTIVATIONS}",
        lambda d: {"activation": "SiLU"},
    ),
    Violation("no_rows_eps_zero", "eps", lambda d: (*_x_and_gamma((0, 6), d), 0.0), rf"eps is 0\.0; accepted: {_EPS}"),
    Violation(
        "no_rows_x_complex64",
        "x",
        lambda d: (*_x_and_gamma((0, 6), d, dtype=torch.complex64), 1e-6),
        rf"x has dtype torch\.complex64; accepted: {_DTYPES}",
    ),
    Violation(
        "no_rows_devices_differ",
        "x and gamma",
        lambda d: (torch.randn(0, 6, device=d), torch.ones(6, device="meta"), 1e-6),
        r"x and gamma are on .* and meta; accepted: both on the same device",
    ),
    Violation(
        "no_rows_gamma_wrong_length",
        "gamma",
        lambda d: (*_x_and_gamma((2, 0, 6), d, gamma_shape=7), 1e-6),
        r"gamma has shape \(7,\); accepted: shape \(6,\)",
    ),
    Violation(
        "no_rows_n_too_large",
        "x",
        lambda d: (*_x_and_gamma((0, MAX_N + 1), d), 1e-6),
        rf"x has rows of N = {MAX_N + 1} elements; accepted: N <= {MAX_N}",
    ),
)
