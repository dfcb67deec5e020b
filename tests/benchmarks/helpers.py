"""What the measurements' tests share: a fake timer, and rows and run files as the sweep writes them, with
hand-written times."""

from __future__ import annotations

from benchmarks.impls import DTYPES, MODES
from benchmarks.rows import bytes_moved
from benchmarks.sweep.points import definition_hash, sweep_points
from benchmarks.sweep.results import RUN_KIND, run_lines
from benchmarks.timing import Timing


class FakeTimer:
    """Returns fixed timings and counts what it was asked to time."""

    def __init__(self, events_s=1e-4, do_bench_s=2e-4, host_s=1e-5):
        self.timing = Timing(events_s, do_bench_s, host_s, "do_bench")
        self.calls = 0

    def __call__(self, call, restore, verify):
        assert verify(call()) is None  # the call must at least run, and give the right answer
        restore()
        self.calls += 1
        return self.timing


def sweep_row(
    point: str,
    impl: str,
    mode: str,
    gpu=None,
    whole=None,
    host=None,
    pct=None,
    ok=True,
    repeat=0,
    origin="sweep",
    split=None,
    session=0,
) -> dict:
    """One row of a run's file; ``point`` is ``regime:dtype:MxN``. Bandwidth follows from ``gpu`` (us) and
    the benchmark's byte model, so a figure has something to draw."""
    regime, dtype, shape = point.split(":")
    m, n = (int(v) for v in shape.split("x"))
    nbytes = bytes_moved(mode, m, n, DTYPES[dtype])
    if split is None:
        split = "fit" if origin == "sweep" and n % 1024 == 0 else "report"
    return dict(
        point=point,
        regime=regime,
        origin=origin,
        split=split,
        M=m,
        N=n,
        dtype=dtype,
        mode=mode,
        impl=impl,
        bytes=nbytes,
        repeat=repeat,
        ok=ok,
        detail="" if ok else "dgamma outside tolerance",
        max_abs=0.0,
        max_rel=0.0,
        checked_rows=m,
        whole_us=whole,
        host_us=host,
        gpu_us=gpu,
        gpu_method="cuda-graph" if gpu else None,
        gpu_note="",
        whole_tbps=nbytes / whole / 1e6 if whole else None,
        gpu_tbps=nbytes / gpu / 1e6 if gpu else None,
        ceiling_tbps=4.0 if pct is not None else None,
        pct_of_ceiling=pct,
        first_call_s=1.0,
        measure_s=1.0,
        session=session,
    )


def tiny_rows(point: str, impls=("triton", "reference"), repeat: int = 0) -> list[dict]:
    return [sweep_row(point, impl, mode, origin="tiny", repeat=repeat) for impl in impls for mode in MODES]


def sweep_run(
    rows: list[dict],
    shapes: str = "sweep",
    definition: str | None = None,
    device: str = "GPU",
    ceilings=None,
    date: str = "2026-01-01T00:00:00+00:00",
) -> dict:
    """A run's file around ``rows`` (the sweep's own definition unless ``definition`` is given)."""
    return dict(
        kind=RUN_KIND,
        shapes=shapes,
        definition=definition or definition_hash(sweep_points(shapes)),
        points=len(sweep_points(shapes)),
        skipped_done=0,
        impls=[],
        timed=True,
        device=device,
        backend="cuda",
        torch="2.11",
        triton="3.6",
        liger_kernel="0.8.5",
        python="3.12",
        date=date,
        protocol={},
        noise_points=[],
        elapsed_s=100.0,
        complete=True,
        remaining=[],
        ceilings=ceilings
        if ceilings is not None
        else [
            dict(
                regime="large",
                when="start",
                bytes=2 << 29,
                whole_us=260.0,
                gpu_us=256.0,
                gpu_method="do_bench",
                gpu_note="",
                whole_tbps=4.1,
                gpu_tbps=4.2,
            )
        ],
        rows=rows,
    )


def write_run(path, run: dict):
    """``run`` (``sweep_run``'s form) as a results file at ``path``, the lines a run appends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_lines(run))
    return path
