"""The sweep's points: hidden sizes, dtypes and regimes, the shapes outside it, their split and their hash.

- hidden sizes N at every multiple of 512 from 1024 to 16384, plus 1000, 4097 and 10000 (34 values);
- bfloat16 at every N; float16 and float32 at every fourth N of that sorted list, from its fourth on
  (2048, 4096, 5632, 7680, 9728, 11264, 13312, 15360: five even and three odd multiples of 512);
- two regimes: ``large``, x holds about 512 MiB (M = round(512 MiB / (N * itemsize))), and ``mid``, about
  32 MiB, where launch and tail effects show;
- shapes outside the sweep (``outside``, large regime): N = 3000, 6244 and 12295 between its points, and
  24576, 32768 and 65536 above it, so that a launch plan fitted to the sweep's points alone is caught;
- the benchmark's small shapes (``benchmark.SMALL_SHAPES``), except one the sweep holds;
- the shapes users run beyond those (their ``origin`` names them; bfloat16):
  - ``narrow``: rows of a per-head q/k norm or a small model, N = 64 to 1024 in steps of 64 and 96, 192,
    320, x of 128 MiB (regime ``act128``); float32 too at N = 128 and 256;
  - ``activation``: x of 64, 128 and 256 MiB (regimes ``act64``, ``act128``, ``act256``), a batch of
    tokens at the hidden sizes of current models, N = 1024 to 16384;
  - ``batch``: small batches, 64 to 2048 rows at N = 256 to 16384 (regime ``batch``, no copy ceiling:
    their target is the fastest peer alone);
  - ``wide``: rows of 20480, 40960 and 49152 in the large regime, between the outside shapes above 16384;
- each point's split: ``fit``, the points a launch plan may be fitted on, or ``report``, the points it is
  judged on: a sweep point is ``fit`` when its N is an even multiple of 512; a narrow one when N is a
  multiple of 128; an activation one at 64 and 256 MiB; a batch one at 64 and 1024 rows; every other
  point (outside, small, wide, and the rest of each family) is ``report``;
- the noise points (``NOISE``), measured again at the end of every run: their spread is the noise the
  report states;
- ``--shapes tiny``: four tiny points, small enough for Triton's interpreter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..benchmark import SMALL_SHAPES
from ..impls import DTYPES

MiB = 1 << 20
GRID_FIRST, GRID_LAST, GRID_STEP = 1024, 16384, 512
EXTRA_N = (1000, 4097, 10000)
OTHER_DTYPES = ("float16", "float32")
#: float16 and float32 at sorted-N positions 3, 7, 11...: 2048 and 4096 among them, five even and three
#: odd multiples of 512, so both splits have points in every dtype.
OTHER_DTYPE_EVERY, OTHER_DTYPE_OFFSET = 4, 3
REGIME_BYTES = {"large": 512 * MiB, "mid": 32 * MiB, "act64": 64 * MiB, "act128": 128 * MiB, "act256": 256 * MiB}
SWEEP_REGIMES = ("large", "mid")
OUTSIDE_REGIME = "large"
#: (N, dtype) outside the sweep: between its points (6244 = 6144 + 100, 12295 = 12288 + 7) and above it.
OUTSIDE: tuple[tuple[int, str], ...] = (
    (3000, "bfloat16"),
    (6244, "bfloat16"),
    (12295, "bfloat16"),
    (24576, "bfloat16"),
    (32768, "bfloat16"),
    (65536, "bfloat16"),
    (24576, "float32"),
)
NARROW_N = tuple(sorted({*range(64, 1025, 64), 96, 192, 320}))
NARROW_FLOAT32_N = (128, 256)
NARROW_REGIME = "act128"
ACTIVATION_N = (1024, 2048, 4096, 5120, 8192, 16384)
ACTIVATION_REGIMES = ("act64", "act128", "act256")
BATCH_ROWS = (64, 256, 1024, 2048)
BATCH_N = (256, 1024, 4096, 16384)
WIDE_N = (20480, 40960, 49152)
#: Where points come from, in the order they are measured; ``--origins`` picks some.
ORIGINS = ("sweep", "outside", "small", "narrow", "activation", "batch", "wide")
#: (regime, dtype, N): measured again at the end of every run; their spread is the stated noise.
NOISE: tuple[tuple[str, str, int], ...] = (
    ("large", "bfloat16", 4096),
    ("large", "bfloat16", 10000),
    ("mid", "bfloat16", 4096),
    ("mid", "bfloat16", 1000),
)
#: --shapes tiny: the same machinery on a few rows, small enough for Triton's interpreter.
TINY: tuple[tuple[int, int, str], ...] = (
    (3, 1024, "bfloat16"),
    (3, 1536, "bfloat16"),
    (5, 1000, "float32"),
    (2, 4097, "float16"),
)
SHAPES = ("sweep", "tiny")


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


@dataclass(frozen=True)
class Point:
    regime: str  # a key of REGIME_BYTES, "small", "batch" or "tiny"
    origin: str  # one of ORIGINS, or "tiny"
    M: int
    N: int
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.regime}:{self.dtype}:{self.M}x{self.N}"

    @property
    def split(self) -> str:
        """``fit`` or ``report``, by the rules of the module's doc."""
        fit = {
            "sweep": self.N % (2 * GRID_STEP) == 0,
            "tiny": self.N % (2 * GRID_STEP) == 0,
            "narrow": self.N % 128 == 0,
            "activation": self.regime in ("act64", "act256"),
            "batch": self.M in (64, 1024),
        }.get(self.origin, False)
        return "fit" if fit else "report"

    @property
    def x_bytes(self) -> int:
        return self.M * self.N * itemsize(self.dtype)


def sweep_ns() -> list[int]:
    """The sweep's hidden sizes, sorted."""
    return sorted({*range(GRID_FIRST, GRID_LAST + 1, GRID_STEP), *EXTRA_N})


def dtypes_at(index: int) -> tuple[str, ...]:
    """The dtypes measured at the ``index``-th N of ``sweep_ns()``."""
    return ("bfloat16", *OTHER_DTYPES) if index % OTHER_DTYPE_EVERY == OTHER_DTYPE_OFFSET else ("bfloat16",)


def rows_for(nbytes: int, n: int, dtype: str) -> int:
    """M such that an (M, N) tensor of ``dtype`` holds about ``nbytes``."""
    return max(1, round(nbytes / (n * itemsize(dtype))))


def sweep_points(shapes: str = "sweep") -> list[Point]:
    """Every point of ``shapes`` ("sweep" or "tiny"), in the order they are measured."""
    if shapes == "tiny":
        return [Point("tiny", "tiny", m, n, dt) for m, n, dt in TINY]
    if shapes != "sweep":
        raise ValueError(f"sweep: shapes is {shapes!r}; accepted: {', '.join(SHAPES)}")
    points = []
    for regime in SWEEP_REGIMES:
        nbytes = REGIME_BYTES[regime]
        for i, n in enumerate(sweep_ns()):
            points += [Point(regime, "sweep", rows_for(nbytes, n, dt), n, dt) for dt in dtypes_at(i)]
    points += [
        Point(OUTSIDE_REGIME, "outside", rows_for(REGIME_BYTES[OUTSIDE_REGIME], n, dt), n, dt) for n, dt in OUTSIDE
    ]
    held = {(p.M, p.N, p.dtype) for p in points}
    points += [Point("small", "small", m, n, dt) for m, n, dt in SMALL_SHAPES if (m, n, dt) not in held]
    narrow = [(n, "bfloat16") for n in NARROW_N] + [(n, "float32") for n in NARROW_FLOAT32_N]
    nbytes = REGIME_BYTES[NARROW_REGIME]
    points += [Point(NARROW_REGIME, "narrow", rows_for(nbytes, n, dt), n, dt) for n, dt in narrow]
    held = {(p.M, p.N, p.dtype) for p in points}
    for regime in ACTIVATION_REGIMES:
        points += [
            Point(regime, "activation", m, n, "bfloat16")
            for n in ACTIVATION_N
            if (m := rows_for(REGIME_BYTES[regime], n, "bfloat16"), n, "bfloat16") not in held
        ]
    points += [Point("batch", "batch", m, n, "bfloat16") for m in BATCH_ROWS for n in BATCH_N]
    large = REGIME_BYTES["large"]
    points += [Point("large", "wide", rows_for(large, n, "bfloat16"), n, "bfloat16") for n in WIDE_N]
    return points


def definition_hash(points: Sequence[Point]) -> str:
    """Names a list of points: runs of different sweeps cannot be merged."""
    return hashlib.sha1("\n".join(p.id for p in points).encode()).hexdigest()[:12]


def noise_points(points: Sequence[Point], shapes: str = "sweep") -> list[Point]:
    """The points each run measures again at its end: ``NOISE`` (the first point of a tiny sweep)."""
    if shapes == "tiny":
        return list(points[:1])
    by_key = {(p.regime, p.dtype, p.N): p for p in points if p.origin == "sweep"}
    return [by_key[key] for key in NOISE]
