"""Time the Triton path under alternative launch plans: the data behind the constants of
``rmsnorm_kernel.ops.launch``.

Each variant is a temporary override of some of those constants (``overrides``), with the plan cache
cleared on the way in and on the way out, so the plans made under a variant are never reused outside
it. Every variant changes what at least one of its shapes launches (a test checks it on an H200's
limits); ``base`` is the plan as the package ships it, timed first at each shape.

Rows are checked against the oracle and timed with the benchmark's protocol (``rows.measure_row``,
``timing.cuda_timer``, ``timing.copy_ceiling``), 10 warm-up calls and 20 samples of 10 calls by default;
'best' marks the fastest correct plan of each shape and mode.

    python -m benchmarks.launch_sweep [--json sweep.json] [--warmup N] [--samples N] [--calls N]

Needs a CUDA GPU: without one it exits 2.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from rmsnorm_kernel.ops import launch, launchers
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import oracle
from rmsnorm_kernel.testing import make_inputs

from .benchmark import table
from .common import (
    OneLineParser,
    at_least,
    cannot_start,
    exit_status,
    keep_earlier_run,
    run_interruptible,
    write_json,
)
from .impls import DTYPES, EPS, MODES, make_impl, versions
from .rows import Result, mark_winners, measure_row
from .timing import Timer, copy_ceiling, cuda_timer

#: name -> the launch constants it overrides.
VARIANTS: dict[str, dict[str, float]] = {
    # small problems: the tile of larger ones, so fewer programs
    "small_tiles_off": {"BWD_MIN_TILES_PER_SM": 0},
    # narrow rows: the tiles, warps, programs and stages of wider ones, and dgamma summed tile by tile
    "narrow_off": {"NARROW_ROW_BYTES": 0},
    # whole rows padded to a power of two for every N up to ROW_LIMIT, instead of chunks
    "whole_rows_fwd": {"WHOLE_ROW_FWD_LIMIT": 8192},
    # the chunked forward: a smaller L2 share, so more warps and fewer programs
    "l2_share_0.2": {"L2_SHARE": 0.2},
    # whole-row backward: tiles of 8 KiB, one pipeline stage fewer
    "bwd_tile_8k": {"BWD_TILE_BYTES": 8192},
    "bwd_s3": {"BWD_STAGES": 3},
    # rows off a 16-byte boundary: more persistent forward programs, deeper pipeline
    "unaligned_pps4_s3": {"UNALIGNED_FWD_PROGRAMS_PER_SM": 4, "UNALIGNED_FWD_STAGES": 3},
    # looped rows: the backward's pipeline depth and statistics chunk, the forward's chunk, the grid
    "loop_s2": {"LOOP_STAGES": 2},
    "stats_8192_w16": {"STATS_BLOCK_N": 8192, "STATS_WARPS": 16},
    "loop_chunk8192": {"LOOP_FWD_MAX_CHUNK": 8192},
    "seg_pps4": {"SEG_PROGRAMS_PER_SM": 4},
}
#: (M, N, dtype) -> the variants timed there, after the base plan.
SHAPES: dict[tuple[int, int, str], tuple[str, ...]] = {
    (128, 257, "float32"): ("small_tiles_off",),
    (262144, 256, "bfloat16"): ("narrow_off",),
    (16384, 5120, "bfloat16"): ("whole_rows_fwd",),
    (16384, 7168, "bfloat16"): ("l2_share_0.2",),
    (65536, 2048, "bfloat16"): ("bwd_tile_8k", "bwd_s3"),
    (8192, 4097, "float16"): ("unaligned_pps4_s3",),
    (8192, 16384, "float32"): ("stats_8192_w16",),
    (2048, 65536, "bfloat16"): ("loop_s2", "loop_chunk8192", "seg_pps4"),
}
BASE = "base"


@contextlib.contextmanager
def overrides(**constants):
    """Set constants of ``launch`` for the duration of the block, then restore them; the plan cache is
    cleared before and after. Refuses names ``launch`` lacks, and names the launchers in ``launchers``
    bound at import (an override in ``launch`` would not reach their launches)."""
    for name in constants:
        if not hasattr(launch, name):
            raise AttributeError(f"launch_sweep: rmsnorm_kernel.ops.launch has no constant {name}")
        if hasattr(launchers, name):
            raise ValueError(
                f"launch_sweep: {name} is read by the launchers in launchers.py directly; "
                "an override would not reach them"
            )
    saved = {name: getattr(launch, name) for name in constants}
    launch.plan.cache_clear()
    try:
        for name, value in constants.items():
            setattr(launch, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(launch, name, value)
        launch.plan.cache_clear()


def run_sweep(
    shapes: dict, device: str, timer: Timer, ceiling_bps: float | None, log=print
) -> tuple[list[Result], list[str]]:
    """One checked, timed row per (shape, variant, mode), the base plan first; returns the rows (the
    variant in ``impl``) and, beside each, the plan it ran under."""
    fn = make_impl("triton", device)
    rows, plans = [], []
    for (m, n, dtype_name), variants in shapes.items():
        inputs = make_inputs((m, n), DTYPES[dtype_name], device)
        expected = oracle(*inputs, EPS)
        for name in (BASE, *variants):
            with overrides(**VARIANTS.get(name, {})):
                p = launch.plan_for(inputs[0], inputs[1])
                for mode in MODES:
                    r = measure_row(mode, name, fn, inputs, expected, timer, ceiling_bps)
                    rows.append(r)
                    plans.append(str(p))
                    log(
                        f"  {m}x{n} {dtype_name:8s} {mode:7s} {name:18s} "
                        f"{'-' if r.events_us is None else f'{r.events_us:.1f}':>9s} us  "
                        f"{'ok' if r.ok else 'FAILED ' + r.detail}"
                    )
        del inputs, expected
        if device == "cuda":
            torch.cuda.empty_cache()
    mark_winners(rows)
    return rows, plans


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.launch_sweep", description=__doc__.strip().split("\n")[0])
    parser.add_argument(
        "--json", type=Path, default=None, help="also write every row, with its plan, to this JSON file"
    )
    parser.add_argument("--warmup", type=at_least(0), default=10, help="warm-up calls before timing (default 10)")
    parser.add_argument("--samples", type=at_least(1), default=20, help="timed samples (default 20)")
    parser.add_argument("--calls", type=at_least(1), default=10, help="calls per sample (default 10)")
    args = parser.parse_args(argv)
    return run_interruptible("launch_sweep", lambda: run(args))


def run(args) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    if (refused := cannot_start("launch_sweep", args.json, backend() == CUDA, "it times kernels")) is not None:
        return refused
    v = versions()
    device_name = torch.cuda.get_device_name()
    print(f"launch sweep on {device_name}: torch {v['torch']}, triton {v['triton']}")
    ceiling = copy_ceiling()
    timer = cuda_timer(args.warmup, args.samples, args.calls, do_bench=False)
    rows, plans = run_sweep(SHAPES, "cuda", timer, ceiling)
    print()
    print(table(rows, ceiling / 1e12))
    if args.json is not None:
        data = dict(
            device=device_name,
            **v,
            ceiling_tbps=ceiling / 1e12,
            protocol=dict(
                warmup_calls=args.warmup, samples=args.samples, calls_per_sample=args.calls, statistic="median"
            ),
            variants=VARIANTS,
            rows=[dict(asdict(r), plan=p) for r, p in zip(rows, plans)],
        )
        keep_earlier_run("launch_sweep", args.json)
        print(f"wrote {write_json(args.json, data)}")
    return exit_status("launch_sweep", sum(not r.ok for r in rows), "row(s) off the oracle (the table above)")


if __name__ == "__main__":
    sys.exit(main())
