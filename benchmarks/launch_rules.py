"""Time whole launch plans against the shipped one over many hidden sizes: the data the rules of
``rmsnorm_kernel.ops.launch`` were fitted on.

Where ``launch_sweep`` overrides one constant at a few shapes, this script replaces the settings of
one kernel by each of a small family of alternatives and times the kernel alone, at x of about 512 MiB
(the sweep's large regime), so that a rule can be read off many N at once:

- ``fwd``: the two-pass forward over chunks of (512 to 4096 elements) x (4 to 16 warps), against the
  shipped forward (whole rows, chunks, or quarter rows as the rules choose);
- ``bwd`` with whole rows: tiles of 1 to 16 rows, 4 or 8 warps, 3 or 4 pipeline stages; rows past
  ROW_LIMIT: the two steps with the row statistics' chunk and warps, and whole rows read twice on 8 to 32
  warps, one or two programs a multiprocessor, one or two stages;
- ``vec1`` in both: the shipped plan with vector loads of one element, what the kernels did before they
  were told the vector width.

Each variant's output is compared with the shipped plan's (the dtype's tolerance of
``ops.tolerances``; the shipped plan itself is checked against the oracle by the test suite and by
the sweep, ``python -m benchmarks.sweep``). Times are ``triton.testing.do_bench`` medians (L2 flushed) of
the launcher alone; ``frac`` is the copy of x divided by the kernel's bytes (2 units of x forward, 3
backward) over the copy's time, so 1.0 is the copy ceiling. One JSON line per variant goes to ``--json``.

    python -m benchmarks.launch_rules [--items fwd:bfloat16:5120,bwd:float32:2048] [--json rules.jsonl]

Without an item list it times ``DEFAULT_ITEMS`` (multiples of 1024, where the rules are fitted). Needs a
CUDA GPU: without one it exits 2. A bad item or a ``--json`` that cannot be written is refused in one line
before any work (exit 2). Each record is written as soon as it is timed, so Ctrl+C (exit 130) or SIGTERM
(exit 143) keeps every record so far; a rerun appends to the file.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from rmsnorm_kernel.ops import launch, launchers
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.tolerances import compare
from rmsnorm_kernel.testing import make_inputs

from .common import OneLineParser, Terminated, cannot_start, exit_status, interrupt_status, run_interruptible
from .impls import DTYPES

EPS = 1e-6
X_BYTES = 512 * 2**20
FWD_CHUNKS = ((512, 4), (1024, 4), (1024, 8), (1024, 16), (2048, 8), (2048, 16), (4096, 16))
BWD_TILES = ((1, 8, 3), (1, 8, 4), (2, 8, 3), (2, 8, 4), (4, 8, 3), (4, 4, 3), (8, 8, 3), (8, 4, 3), (16, 8, 3))
STATS = ((1024, 8), (2048, 4), (2048, 8), (4096, 8), (8192, 16))
#: (warps, programs a multiprocessor, stages) of the backward over whole rows read twice
REREAD = ((8, 2, 1), (8, 2, 2), (16, 1, 1), (16, 1, 2), (16, 2, 2), (32, 1, 1), (32, 1, 2))
DEFAULT_ITEMS = (
    [f"fwd:bfloat16:{n}" for n in range(3072, 16385, 1024)]
    + [f"fwd:float32:{n}" for n in (3072, 5120, 6144, 7168, 10240, 12288)]
    + [f"bwd:bfloat16:{n}" for n in range(1024, 8193, 1024)]
    + [f"bwd:float32:{n}" for n in (1024, 2048, 3072, 4096, 6144, 8192)]
    + [f"bwd:bfloat16:{n}" for n in (9216, 13312, 16384)]
    + [f"bwd:float32:{n}" for n in (9728, 12288, 16384)]
)


def forward_variants(base: launch.Plan, rows: int) -> dict[str, launch.Plan]:
    """The shipped forward and the two-pass forward (one program a row) at each (chunk, warps) of
    FWD_CHUNKS."""
    out = {"base": base}
    if base.vec > 1:
        out["vec1"] = dataclasses.replace(base, vec=1)
    for chunk, warps in FWD_CHUNKS:
        out[f"chunk{chunk}_w{warps}"] = dataclasses.replace(
            base, fwd_two_pass=True, block_n=chunk, fwd_block_m=1, fwd_warps=warps, fwd_programs=rows, fwd_stages=1
        )
    return _without_repeats(out)


def backward_variants(
    base: launch.Plan, rows: int, n: int, x_bytes: int, gpu: launch.Gpu, gamma_bytes: int
) -> dict[str, launch.Plan]:
    """The shipped backward and, for whole rows, each (rows per tile, warps, stages) of BWD_TILES that
    fits in shared memory, summing dgamma as the shipped plan does (``Plan.bwd_rowwise_dgamma``); for
    rows past ROW_LIMIT, the two steps with each (chunk, warps) of STATS for the row statistics, and for
    those of at most REREAD_MAX_LANES lanes whole rows read twice at each (warps, programs a
    multiprocessor, stages) of REREAD that fits."""
    out = {"base": base}
    if base.vec > 1:
        out["vec1"] = dataclasses.replace(base, vec=1)
    if triton.next_power_of_2(n) > launch.ROW_LIMIT:
        looped = dataclasses.replace(base, **launch.looped_backward(rows, n, gpu, x_bytes, gamma_bytes, False))
        out["two_steps"] = looped
        for chunk, warps in STATS:
            out[f"stats{chunk}_w{warps}"] = dataclasses.replace(looped, stats_block_n=chunk, stats_warps=warps)
        if sum(launch.row_pieces(n)) <= launch.REREAD_MAX_LANES:
            stage_bytes = launch.reread_stage_bytes(n, x_bytes, gamma_bytes, False)
            for warps, per_sm, stages in REREAD:
                if launch.stages_that_fit(stages, stage_bytes, gpu.smem_bytes // per_sm) == stages:
                    settings = launch.reread_backward(
                        rows, n, gpu, x_bytes, gamma_bytes, False, (warps, per_sm, stages)
                    )
                    out[f"reread_w{warps}_p{per_sm}_s{stages}"] = dataclasses.replace(base, **settings)
        return _without_repeats(out)
    lanes = base.bwd_block_n + base.bwd_block_n2  # the shipped plan's pieces of a row
    if base.bwd_block_n2:  # the row as one piece of the next power of two instead
        one = triton.next_power_of_2(n)
        stages = launch.stages_that_fit(base.bwd_stages, 2 * base.bwd_block_m * one * x_bytes, gpu.smem_bytes)
        out["one_piece"] = dataclasses.replace(base, bwd_block_n=one, bwd_block_n2=0, bwd_stages=stages)
    for block_m, warps, stages in BWD_TILES:
        if (stages - 1) * 2 * block_m * lanes * x_bytes > gpu.smem_bytes - launch.SMEM_RESERVE_BYTES:
            continue
        programs = min(triton.cdiv(rows, block_m), launch.BWD_PROGRAMS_PER_SM * gpu.sms)
        out[f"rows{block_m}_w{warps}_s{stages}"] = dataclasses.replace(
            base,
            bwd_block_m=block_m,
            bwd_warps=warps,
            partial_rows=programs,
            bwd_grid=(programs, 1),
            bwd_stages=stages,
        )
    return _without_repeats(out)


def _without_repeats(variants: dict[str, launch.Plan]) -> dict[str, launch.Plan]:
    """The first name of each distinct plan: a variant equal to the shipped plan is the shipped plan."""
    seen, out = set(), {}
    for name, p in variants.items():
        if p not in seen:
            seen.add(p)
            out[name] = p
    return out


def run_item(kind: str, dtype_name: str, n: int, device: str, bench, x_bytes_total: int = X_BYTES):
    """Yield one record per variant of ``kind`` at (about x_bytes_total / row bytes) rows of N."""
    dtype = DTYPES[dtype_name]
    rows = max(1, x_bytes_total // (n * dtype.itemsize))
    x, gamma, dy = make_inputs((rows, n), dtype, device)
    gpu = launch.gpu_for(x)
    base = launch.plan_for(x, gamma)
    copy_out = torch.empty_like(x)
    copy_ms = bench(lambda: copy_out.copy_(x))
    if kind == "fwd":
        variants = forward_variants(base, rows)
        run = lambda p: (launchers.rmsnorm_forward(x, gamma, EPS, p),)  # noqa: E731
        units = 1.0
    else:
        variants = backward_variants(base, rows, n, dtype.itemsize, gpu, gamma.element_size())
        run = lambda p: launchers.rmsnorm_backward(dy, x, gamma, EPS, p)  # noqa: E731
        units = 1.5
    expected = run(base)
    for name, p in variants.items():
        got = run(p)
        ok = all(compare(g, e).ok for g, e in zip(got, expected))
        ms = bench(lambda p=p: run(p))
        yield dict(
            kind=kind,
            dtype=dtype_name,
            M=rows,
            N=n,
            variant=name,
            ok=ok,
            ms=ms,
            frac=units * copy_ms / ms,
            plan=dataclasses.asdict(p),
        )


def parse_items(text: str) -> list[tuple[str, str, int]]:
    """``kind:dtype:N,...`` as tuples; ValueError with one line naming the bad item and what is accepted."""
    items = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if (
            len(parts) != 3
            or parts[0] not in ("fwd", "bwd")
            or parts[1] not in DTYPES
            or not parts[2].isdigit()
            or not 1 <= int(parts[2]) <= MAX_N
        ):
            raise ValueError(
                f"launch_rules: --items has {item!r}; accepted: kind:dtype:N with kind fwd or bwd, "
                f"dtype one of {', '.join(DTYPES)}, 1 <= N <= {MAX_N}"
            )
        items.append((parts[0], parts[1], int(parts[2])))
    return items


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.launch_rules", description=__doc__.strip().split("\n")[0])
    parser.add_argument("--items", default=",".join(DEFAULT_ITEMS), help="comma-separated kind:dtype:N")
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("outputs/launch-rules.jsonl"),
        help="JSON lines, appended (a rerun adds to the records already there)",
    )
    args = parser.parse_args(argv)
    return run_interruptible("launch_rules", lambda: run(args))


def run(args) -> int:
    """The command, on parsed arguments; every argument is checked before any work."""
    try:
        items = parse_items(args.items)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if (refused := cannot_start("launch_rules", args.json, backend() == CUDA, "it times kernels")) is not None:
        return refused

    def bench(fn):
        return do_bench(fn, warmup=10, rep=50, return_mode="median")

    wrong = 0
    try:
        with args.json.open("a") as out:
            for kind, dtype_name, n in items:
                for record in run_item(kind, dtype_name, n, "cuda", bench):
                    out.write(json.dumps(record) + "\n")
                    out.flush()  # a record is on disk before the next is timed: an interrupt loses none
                    wrong += not record["ok"]
                    print(
                        f"{kind} {dtype_name:8s} N={n:>5d} {record['variant']:16s} {record['ms'] * 1e3:8.1f} us "
                        f"{record['frac']:.3f} {'ok' if record['ok'] else 'WRONG'}"
                    )
                torch.cuda.empty_cache()
    except (KeyboardInterrupt, Terminated) as exc:
        name, status = interrupt_status(exc)
        print(f"launch_rules: stopped by {name}; the records timed so far are in {args.json}", file=sys.stderr)
        return status
    return exit_status("launch_rules", wrong, f"variant(s) off the oracle (WRONG above, and in {args.json})")


if __name__ == "__main__":
    sys.exit(main())
