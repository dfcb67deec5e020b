"""One measured row: an implementation in one direction at one shape, checked against the oracle, then timed.

- the byte model (``bytes_moved``): the fewest bytes an operation must move; bandwidths derive from it;
- the oracle check (``check_outputs``): every output under ``ops.tolerances.compare``; a wrong result
  marks the row failed, it is not timed and it can win nothing;
- ``measure_row``: the check, then the timing by a ``timing.Timer``, into a ``Result``;
- ``mark_winners``: the fastest correct row of each (shape, dtype, mode), and the Triton rows' speedup.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from rmsnorm_kernel.checks.report import dtype_name, one_line
from rmsnorm_kernel.ops.tolerances import compare

from .impls import FWD, FWD_BWD, ForwardFn, make_call
from .timing import Timer

# --------------------------------------------------------------------------------------------------
# The byte model


def bytes_moved(mode: str, m: int, n: int, x_dtype: torch.dtype, gamma_dtype: torch.dtype | None = None) -> int:
    """The fewest bytes ``mode`` must move through device memory for an (M, N) problem.

    forward: read x, write y (2*M*N elements) and read gamma (N). forward + backward: the forward's
    2*M*N, then read x and dy and write dx (3*M*N), plus gamma read and dgamma written (2*N).
    """
    es = torch.empty((), dtype=x_dtype).element_size()
    gs = torch.empty((), dtype=gamma_dtype or x_dtype).element_size()
    if mode == FWD:
        return 2 * m * n * es + n * gs
    if mode == FWD_BWD:
        return 5 * m * n * es + 2 * n * gs
    raise ValueError(f"bytes_moved: mode is {mode!r}; accepted: {FWD!r}, {FWD_BWD!r}")


def tbps(nbytes: int, seconds: float | None) -> float | None:
    return None if not seconds else nbytes / seconds / 1e12


# --------------------------------------------------------------------------------------------------
# Checking against the oracle


@dataclass
class Check:
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def check_outputs(outputs: tuple, expected: tuple, rows: list[int] | None = None) -> Check:
    """Compare (y,) or (y, dx, dgamma) with the oracle's under ``compare``; the first failing output
    is named in ``detail``. With ``rows``, ``expected`` holds y and dx on those rows only (dgamma whole)
    and the same rows of ``outputs`` are compared."""
    worst = Check(True, 0.0, 0.0)
    for i, (name, got, want) in enumerate(zip(("y", "dx", "dgamma"), outputs, expected)):
        if got is not None:
            got = got.detach()
            if rows is not None and i < 2 and got.dim() == 2:
                got = got.index_select(0, torch.tensor(rows, device=got.device))
        if got is None or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            got_desc = "None" if got is None else f"{tuple(got.shape)} {got.dtype}"
            return Check(
                False, math.inf, math.inf, f"{name}: got {got_desc}, expected {tuple(want.shape)} {want.dtype}"
            )
        c = compare(got, want)
        worst.ok = worst.ok and c.ok
        worst.max_abs, worst.max_rel = max(worst.max_abs, c.max_abs), max(worst.max_rel, c.max_rel)
        if not c.ok and not worst.detail:
            worst.detail = f"{name} outside tolerance (max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g})"
    return worst


# --------------------------------------------------------------------------------------------------
# One row: checked, then timed


@dataclass
class Result:
    shape: str
    M: int
    N: int
    dtype: str
    mode: str
    impl: str
    ok: bool
    detail: str
    max_abs: float | None
    max_rel: float | None
    bytes: int
    checked_rows: int | None = None  # rows of y and dx compared with the oracle (dgamma: always all)
    first_call_s: float | None = None  # the checked first call: compiles and Triton's JIT land here
    events_us: float | None = None
    gpu_us: float | None = None
    host_us: float | None = None
    gpu_method: str | None = None
    gpu_note: str = ""
    bandwidth_tbps: float | None = None  # from events_us
    gpu_tbps: float | None = None  # from gpu_us
    pct_of_ceiling: float | None = None  # bandwidth_tbps against the copy ceiling
    winner: bool = False
    speedup_vs_best_peer: float | None = None  # Triton rows: best correct peer's time / Triton's time


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def measure_row(
    mode: str,
    impl: str,
    fn: ForwardFn,
    inputs: tuple,
    expected: tuple,
    timer: Timer,
    ceiling_bps: float | None = None,
    rows: list[int] | None = None,
) -> Result:
    """Check one implementation in one direction against the oracle's ``expected`` outputs (y and dx on
    ``rows`` only when given, see ``check_outputs``), then time it with ``timer``. A failed check is not
    timed; an implementation that raises is a failed row; a timing that raises leaves the row checked
    but untimed, with the reason in ``gpu_note``."""
    x, gamma, dy = inputs
    m, n = x.shape
    nbytes = bytes_moved(mode, m, n, x.dtype, gamma.dtype)
    row = Result(
        shape=f"{m}x{n}",
        M=m,
        N=n,
        dtype=dtype_name(x.dtype),
        mode=mode,
        impl=impl,
        ok=False,
        detail="",
        max_abs=None,
        max_rel=None,
        bytes=nbytes,
        checked_rows=m if rows is None else len(rows),
    )
    want = expected[:1] if mode == FWD else expected
    cuda = x.device.type == "cuda"
    t0 = time.perf_counter()
    try:
        outputs = make_call(mode, fn, x, gamma, dy.clone())()  # its own dy: Liger writes dx over it
        if cuda:
            torch.cuda.synchronize()
        row.first_call_s = time.perf_counter() - t0
        check = check_outputs(outputs, want, rows)
        del outputs
    except Exception as exc:  # an implementation that raises is a failed row, not a failed run
        row.detail = f"raised {type(exc).__name__}: {exc}"[:300]
        return row
    row.ok, row.detail, row.max_abs, row.max_rel = check.ok, check.detail, check.max_abs, check.max_rel
    if not check.ok:
        return row
    work_dy = dy.clone()
    call = make_call(mode, fn, x, gamma, work_dy)

    def verify(outputs) -> str | None:
        c = check_outputs(outputs if isinstance(outputs, tuple) else (outputs,), want, rows)
        return None if c.ok else (c.detail or "outside tolerance")

    try:
        timing = timer(call, lambda: work_dy.copy_(dy), verify)
    except Exception as exc:  # out of memory, say: the row stays checked but untimed, the run goes on
        row.gpu_note = f"timing raised {one_line(exc)}"[:300]
        if cuda:
            torch.cuda.empty_cache()
        return row
    row.events_us, row.gpu_us, row.host_us = _us(timing.events_s), _us(timing.gpu_s), _us(timing.host_s)
    row.gpu_method, row.gpu_note = timing.gpu_method, timing.gpu_note
    row.bandwidth_tbps, row.gpu_tbps = tbps(nbytes, timing.events_s), tbps(nbytes, timing.gpu_s)
    if row.bandwidth_tbps is not None and ceiling_bps:
        row.pct_of_ceiling = 100.0 * row.bandwidth_tbps * 1e12 / ceiling_bps
    return row


def mark_winners(results: list[Result]) -> None:
    """Per (shape, dtype, mode): the fastest correct row by the events median wins; Triton rows get
    their speedup over the best correct peer."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.shape, r.dtype, r.mode), []).append(r)
    for rows in groups.values():
        timed = [r for r in rows if r.ok and r.events_us is not None]
        for r in rows:
            r.winner = False
        if timed:
            min(timed, key=lambda r: r.events_us).winner = True
        peers = [r for r in timed if r.impl != "triton"]
        for r in timed:
            if r.impl == "triton" and peers:
                r.speedup_vs_best_peer = min(p.events_us for p in peers) / r.events_us
