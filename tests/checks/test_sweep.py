"""The benchmark sweep of issue 19 without timing anything: its points, byte model, parts, merge and report.

Timings are injected (fake timers, hand-written rows), never measured; the end-to-end runs use
``--shapes tiny`` through Triton's interpreter, which is what the command does without a GPU.
"""

import json

import pytest
import torch

from rmsnorm_kernel.checks import benchmark as bm
from rmsnorm_kernel.checks import figures
from rmsnorm_kernel.checks import sweep as sw
from rmsnorm_kernel.checks import sweep_measure as sm
from rmsnorm_kernel.checks import sweep_report as sr
from rmsnorm_kernel.ops.backend import CUDA, backend
from rmsnorm_kernel.ops.reference import manual_backward, oracle, rmsnorm_reference
from rmsnorm_kernel.testing import forward_block_mean, make_inputs
from tests.checks.helpers import run_cli, sweep_row, sweep_run
from tests.helpers import DEVICE

no_gpu_only = pytest.mark.skipif(backend() == CUDA, reason="what the command does without a GPU")

MiB = 1 << 20
#: float16 and float32 points, written out: every fourth N of the sorted sweep from the fourth on.
OTHER_DTYPE_NS = {2048, 4096, 5632, 7680, 9728, 11264, 13312, 15360}


# --------------------------------------------------------------------------------------------------
# The points


def test_hidden_sizes_are_every_multiple_of_512_from_1024_to_16384_and_three_more():
    ns = sw.sweep_ns()
    assert len(ns) == 34 and ns == sorted(ns)
    assert [n for n in ns if n % 512 == 0] == list(range(1024, 16385, 512))  # 31 multiples
    assert [n for n in ns if n % 512] == [1000, 4097, 10000]


def test_bfloat16_everywhere_and_the_other_dtypes_at_every_fourth_point():
    points = sw.sweep_points()
    for regime in ("large", "mid"):
        of = lambda dt: [p.N for p in points if p.regime == regime and p.origin == "sweep" and p.dtype == dt]  # noqa: E731
        assert of("bfloat16") == sw.sweep_ns()
        assert set(of("float16")) == set(of("float32")) == OTHER_DTYPE_NS
        assert len(of("float16")) == len(of("float32")) == 8
    # both splits have points in every dtype
    others = [p for p in points if p.origin == "sweep" and p.dtype != "bfloat16"]
    assert {p.N for p in others if p.split == "fit"} == {2048, 4096, 11264, 13312, 15360}
    assert {p.N for p in others if p.split == "report"} == {5632, 7680, 9728}


def test_each_regime_holds_its_bytes_in_x():
    points = sw.sweep_points()
    for p in points:
        if p.regime in sw.REGIME_BYTES:
            row_bytes = p.N * sw.itemsize(p.dtype)
            assert abs(p.x_bytes - sw.REGIME_BYTES[p.regime]) <= row_bytes / 2, p.id
    by_id = {p.id: p for p in points}
    # written out: 512 MiB / (4096 * 2) = 65536 rows; 32 MiB / (1000 * 2) = 16777.216; 512 MiB / (24576 * 4) = 5461.33
    assert {
        "large:bfloat16:65536x4096",
        "mid:bfloat16:16777x1000",
        "large:float32:5461x24576",
        "mid:float32:2048x4096",
        "large:bfloat16:4096x65536",
    } <= set(by_id)
    assert sw.REGIME_BYTES == {"large": 512 * MiB, "mid": 32 * MiB}


def test_point_counts_outside_shapes_and_small_shapes():
    points = sw.sweep_points()
    assert len(points) == len({p.id for p in points}) == 109
    count = lambda **kw: sum(all(getattr(p, k) == v for k, v in kw.items()) for p in points)  # noqa: E731
    assert count(regime="large", origin="sweep") == count(regime="mid", origin="sweep") == 34 + 8 + 8
    outside = [(p.N, p.dtype, p.regime) for p in points if p.origin == "outside"]
    assert outside == [
        (3000, "bfloat16", "large"),
        (6244, "bfloat16", "large"),
        (12295, "bfloat16", "large"),
        (24576, "bfloat16", "large"),
        (32768, "bfloat16", "large"),
        (65536, "bfloat16", "large"),
        (24576, "float32", "large"),
    ]
    assert all(p.N not in sw.sweep_ns() or p.N > 16384 for p in points if p.origin == "outside")
    # the benchmark's small shapes stay; 4096x4096 float16 is the mid regime's own point
    assert [p.id for p in points if p.origin == "small"] == ["small:float32:128x257", "small:float32:32x257"]
    assert "mid:float16:4096x4096" in {p.id for p in points}


def test_fit_split_is_the_even_multiples_of_512_within_the_sweep():
    points = sw.sweep_points()
    fit = [p for p in points if p.split == "fit"]
    assert all(p.origin == "sweep" and p.N % 1024 == 0 for p in fit)
    assert len(fit) == 2 * (16 + 5 + 5)  # per regime: bfloat16 at 1024..16384 step 1024, and 5 N of each other dtype
    assert sw.Point("large", "sweep", 1, 1536, "bfloat16").split == "report"  # an odd multiple
    assert sw.Point("large", "sweep", 1, 4097, "bfloat16").split == "report"
    assert sw.Point("large", "outside", 1, 32768, "bfloat16").split == "report"  # even, but outside the sweep
    assert sum(p.split == "report" for p in points) == 109 - 52


def test_noise_points_are_sweep_points():
    points = sw.sweep_points()
    noise = sw.noise_points(points)
    assert [p.id for p in noise] == [
        "large:bfloat16:65536x4096",
        "large:bfloat16:26844x10000",
        "mid:bfloat16:4096x4096",
        "mid:bfloat16:16777x1000",
    ]
    assert sw.noise_points(sw.sweep_points("tiny"), "tiny") == sw.sweep_points("tiny")[:1]


def test_definition_hash_names_the_list_of_points():
    assert sw.definition_hash(sw.sweep_points()) == sw.definition_hash(sw.sweep_points())
    assert sw.definition_hash(sw.sweep_points()) != sw.definition_hash(sw.sweep_points()[:-1])
    with pytest.raises(ValueError, match="shapes is 'huge'"):
        sw.sweep_points("huge")


# --------------------------------------------------------------------------------------------------
# Byte model, estimate and parts


def test_the_byte_model_of_a_sweep_point():
    p = sw.Point("large", "sweep", 65536, 4096, "bfloat16")
    # forward: read x, write y (2 * 65536 * 4096 bf16) + read gamma (4096 bf16)
    assert bm.bytes_moved(bm.FWD, p.M, p.N, torch.bfloat16) == 1_073_741_824 + 8_192
    # forward + backward: x, y; x, dy, dx (5 * 65536 * 4096 bf16) + gamma, dgamma
    assert bm.bytes_moved(bm.FWD_BWD, p.M, p.N, torch.bfloat16) == 2_684_354_560 + 16_384


def test_the_estimate_counts_two_compiles_per_point():
    points = sw.sweep_points()[:3]
    est = sw.estimate_run(points, points[:1], bm.IMPLS)
    assert est["compiles"] == 8 and est["compile_s"] == pytest.approx(4 * sum(sw.EST_COMPILE_S.values()))
    assert est["total_s"] == pytest.approx(est["startup_s"] + est["compile_s"] + est["measure_s"])
    without = sw.estimate_run(points, points[:1], [i for i in bm.IMPLS if i != "compile"])
    assert without["compiles"] == 0 and without["total_s"] < est["total_s"]
    # a reference call on 512 MiB takes longer than on 32 MiB
    large, mid = sw.Point("large", "sweep", 65536, 4096, "bfloat16"), sw.Point("mid", "sweep", 4096, 4096, "bfloat16")
    assert sw.estimate_measurement_s(large, "reference", bm.FWD_BWD) > sw.estimate_measurement_s(
        mid, "reference", bm.FWD_BWD
    )


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_parts_hold_every_point_once_in_order_and_about_equal_time(parts):
    points = sw.sweep_points()
    dealt = sw.partition(points, parts)
    assert len(dealt) == parts
    assert sorted(p.id for d in dealt for p in d) == sorted(p.id for p in points)
    order = [p.id for p in points]
    for d in dealt:
        assert [p.id for p in d] == [i for i in order if i in {p.id for p in d}]
    loads = [sum(sw.estimate_point_s(p) for p in d) for d in dealt]
    assert max(loads) - min(loads) <= max(sw.estimate_point_s(p) for p in points)
    assert sw.partition(points, parts) == dealt  # the same split every time


def test_the_sweep_fits_two_runs_of_the_budget_by_its_own_estimate():
    points = sw.sweep_points()
    noise = sw.noise_points(points)
    runs = [sw.estimate_run(d, noise, bm.IMPLS)["total_s"] for d in sw.partition(points, 2)]
    assert sum(runs) <= 20 * 60 and all(r <= sw.DEFAULT_DEADLINE_S for r in runs)


def test_part_and_impl_arguments_are_checked():
    assert sw.parse_part("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(SystemExit, match="accepted: K/P"):
            sw.parse_part(bad)
    with pytest.raises(ValueError, match="0 parts"):
        sw.partition(sw.sweep_points(), 0)


# --------------------------------------------------------------------------------------------------
# The oracle on the checked rows


def test_checked_rows_are_all_up_to_the_limit_then_edges_and_a_spread():
    assert sm.check_rows(4096, 4096) is None  # 2**24 elements: every row
    rows = sm.check_rows(131072, 4096)
    assert rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == 131071
    assert set(range(64)) <= set(rows) and set(range(131072 - 64, 131072)) <= set(rows)
    assert len(rows) <= 64 + 64 + 128


def test_expected_outputs_on_some_rows_are_the_oracle_on_those_rows(device):
    x, gamma, dy = make_inputs((37, 33), torch.bfloat16, device)
    rows = sm.check_rows(37, 33, full_limit=0)
    assert rows == list(range(37))  # fewer rows than the edges take: all of them, still by index
    rows = [0, 5, 36]
    y, dx, dgamma = sm.expected_outputs(x, gamma, dy, rows)
    full = oracle(x, gamma, dy)
    assert torch.equal(y, full[0][rows]) and torch.equal(dx, full[1][rows])
    assert torch.equal(dgamma, full[2])  # the same float64 sum, in chunks, rounded to bfloat16
    assert sm.check_selected((full[0], full[1], full[2]), (y, dx, dgamma), rows).ok
    assert not sm.check_selected((full[0], full[1] * 1.5, full[2]), (y, dx, dgamma), rows).ok


def test_dgamma_is_summed_over_every_row_in_chunks(device, monkeypatch):
    monkeypatch.setattr(sm, "DGAMMA_CHUNK_ELEMENTS", 64)  # 64 // 33 = 1 row per chunk
    x, gamma, dy = make_inputs((9, 33), torch.float32, device)
    _, _, dgamma = sm.expected_outputs(x, gamma, dy, [0])
    want = manual_backward(x.double(), gamma.double(), dy.double())[1].float()
    torch.testing.assert_close(dgamma, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# Measuring with injected timers


class FakeTimers:
    """Fixed times; ``gpu`` runs the call as a graph's timing would, then once more after ``restore``
    (unless told not to), and verifies that last call."""

    timed = True

    def __init__(self, restore=True):
        self.restore = restore
        self.verified = []

    def whole(self, call):
        for _ in range(3):  # calls back to back, as the whole-call samples do
            call()
        return 2e-4, 5e-5

    def gpu(self, call, restore, verify):
        for _ in range(3):  # warm-up and replays, as a CUDA graph's timing runs the call
            call()
        if self.restore:
            restore()
        problem = verify(call())
        self.verified.append(problem)
        return (1e-4, sm.GRAPH, "") if problem is None else (3e-4, sm.PROFILER, f"replay wrong ({problem})")


class _InPlaceGrad(torch.autograd.Function):
    """A backward that writes dx over dy, as Liger's default in_place=True does."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return rmsnorm_reference(x, g, bm.EPS)

    @staticmethod
    def backward(ctx, dy):
        x, g = ctx.saved_tensors
        dx, dg = manual_backward(x, g, dy, bm.EPS)
        dy.copy_(dx)
        return dy, dg


def _in_place(x, g):
    return _InPlaceGrad.apply(x, g)


@pytest.mark.parametrize("restore", [True, False])
def test_a_replay_is_checked_after_the_inputs_a_call_overwrites_are_put_back(device, restore):
    point = sw.Point("tiny", "tiny", 4, 64, "float32")
    inputs = make_inputs((4, 64), torch.float32, device)
    expected = sm.expected_outputs(*inputs, None)
    timers = FakeTimers(restore)
    row = sm.measure_row(point, bm.FWD_BWD, "inplace", _in_place, inputs, expected, None, timers)
    assert row.ok  # the first call gets its own copy of dy
    if restore:
        assert timers.verified == [None] and row.gpu_method == sm.GRAPH and row.gpu_us == pytest.approx(100.0)
    else:  # the calls before turned dy into dx of dx...: the replay is wrong, the profiler times it
        assert timers.verified[0] is not None and row.gpu_method == sm.PROFILER and "replay wrong" in row.gpu_note


def test_a_row_holds_both_times_its_bandwidth_and_its_share_of_the_ceiling(device):
    point = sw.Point("large", "sweep", 4, 1024, "bfloat16")  # a stand-in: only the regime's ceiling matters here
    inputs = make_inputs((4, 1024), torch.bfloat16, device)
    expected = sm.expected_outputs(*inputs, None)
    row = sm.measure_row(
        point, bm.FWD, "reference", lambda x, g: rmsnorm_reference(x, g, bm.EPS), inputs, expected, None, FakeTimers()
    )
    nbytes = 2 * 4 * 1024 * 2 + 1024 * 2
    assert row.ok and row.bytes == nbytes and row.checked_rows == 4
    assert (
        row.whole_us == pytest.approx(200.0)
        and row.host_us == pytest.approx(50.0)
        and row.gpu_us == pytest.approx(100.0)
    )
    assert row.gpu_tbps == pytest.approx(nbytes / 1e-4 / 1e12) and row.whole_tbps == pytest.approx(nbytes / 2e-4 / 1e12)
    ceilings = [
        dict(regime="large", gpu_tbps=2e-7),
        dict(regime="large", gpu_tbps=4e-7),
        dict(regime="mid", gpu_tbps=1.0),
    ]
    sm.apply_ceilings([row], ceilings)  # the larger of the regime's two measurements
    assert row.ceiling_tbps == 4e-7 and row.pct_of_ceiling == pytest.approx(100 * nbytes / 1e-4 / 1e12 / 4e-7)


def test_a_wrong_implementation_fails_its_check_and_is_not_timed(device):
    point = sw.Point("tiny", "tiny", 5, 257, "float32")
    inputs = make_inputs((5, 257), torch.float32, device)
    expected = sm.expected_outputs(*inputs, None)
    timers = FakeTimers()
    row = sm.measure_row(
        point, bm.FWD, "wrong", lambda x, g: forward_block_mean(x, g, bm.EPS), inputs, expected, None, timers
    )
    assert not row.ok and "y outside tolerance" in row.detail and row.gpu_us is None and timers.verified == []
    row = sm.measure_row(
        point, bm.FWD_BWD, "wrong", lambda x, g: forward_block_mean(x, g, bm.EPS), inputs, expected, None, timers
    )
    assert not row.ok and row.detail.startswith("raised")


@pytest.mark.parametrize("outcome", ["graph", "wrong replay", "no capture"])
def test_gpu_time_falls_back_to_the_profiler_and_says_why(monkeypatch, outcome):
    """CudaTimers.gpu's choice, with the graph and the profiler stubbed (they need a GPU)."""
    timers, restored = sm.CudaTimers(), []

    def graph(call, restore, verify):
        if outcome == "no capture":
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1e-4, None if outcome == "graph" else "dx outside tolerance"

    monkeypatch.setattr(timers, "_graph", graph)
    monkeypatch.setattr(timers, "_profiler", lambda call: 2e-4)
    monkeypatch.setattr(sm.torch.cuda, "synchronize", lambda: None)
    seconds, method, note = timers.gpu(lambda: None, lambda: restored.append(1), lambda out: None)
    if outcome == "graph":
        assert (seconds, method, note, restored) == (1e-4, sm.GRAPH, "", [])
    else:  # the profiler times the call, on inputs put back first
        assert (seconds, method, restored) == (2e-4, sm.PROFILER, [1])
        words = (
            "replay is wrong (dx outside tolerance)"
            if outcome == "wrong replay"
            else "no CUDA graph (RuntimeError: operation not"
        )
        assert words in note and note.endswith("timed from the profiler")


class FakeClock:
    """Time that moves only when the impl factory is asked for an implementation: one second each."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def factory(self, impl, device):
        self.t += 1.0
        return bm.make_impl(impl, device)


def test_a_run_stops_before_a_point_that_would_pass_its_deadline_and_says_what_is_left(device):
    points = sw.sweep_points("tiny")
    clock, writes, lines = FakeClock(), [], []
    impls = ["triton", "reference", "F.rms_norm"]
    est = sw.estimate_point_s(points[0], impls, timed=False)
    rows, ceilings, remaining = sw.run_part(
        points[:2],
        points[:1],
        impls,
        device,
        sm.NoTimers(),
        write=lambda *a: writes.append(a),
        deadline_s=3 + est - 0.5,
        impl_factory=clock.factory,
        log=lines.append,
        clock=clock,
    )
    # the first point starts at 0 and ends at 3 s; the second would end past 3 + est - 0.5
    assert {r.point for r in rows} == {points[0].id} and remaining == [points[1]]
    assert len(rows) == 6 and all(r.ok and r.gpu_us is None for r in rows) and ceilings == []
    assert any(line.startswith("deadline:") and "1 point(s) left" in line for line in lines)
    assert len(writes) == 2 and writes[-1][2] == [points[1]]  # after the point, and at the end


# --------------------------------------------------------------------------------------------------
# Merging runs


def _tiny_rows(point, impls=("triton", "reference"), repeat=0):
    return [sweep_row(point, impl, mode, origin="tiny", repeat=repeat) for impl in impls for mode in bm.MODES]


def test_runs_merge_into_one_file_with_repeats_and_missing_points_named():
    ids = [p.id for p in sw.sweep_points("tiny")]
    run1 = sweep_run(_tiny_rows(ids[0]) + _tiny_rows(ids[1]) + _tiny_rows(ids[0], repeat=1), part="1/2", shapes="tiny")
    run2 = sweep_run(_tiny_rows(ids[2]) + _tiny_rows(ids[0]), part="2/2", shapes="tiny")  # ids[0] measured again
    for i, run in enumerate((run1, run2)):
        run["file"] = f"run{i}.json"
    merged = sr.merge([run1, run2])
    assert merged["kind"] == "benchmark-sweep" and merged["missing"] == [ids[3]]
    assert len(merged["rows"]) == 4 * 5
    by = {}
    for r in merged["rows"]:
        by.setdefault((r["point"], r["session"]), []).append(r["repeat"])
    assert sorted(by[(ids[0], 0)]) == [0] * 4 + [1] * 4 and by[(ids[0], 1)] == [1] * 4  # the later run's: repeats
    assert by[(ids[2], 1)] == [0] * 4
    assert [r["part"] for r in merged["runs"]] == ["1/2", "2/2"] and merged["warnings"] == []


def test_runs_of_different_sweeps_do_not_merge_and_differences_are_warned():
    a, b = sweep_run([], shapes="tiny"), sweep_run([], shapes="tiny", definition="0123456789ab")
    a["file"], b["file"] = "a.json", "b.json"
    with pytest.raises(sr.MergeError, match="different sweeps"):
        sr.merge([a, b])
    c = sweep_run([], shapes="tiny", device="another GPU")
    c["file"] = "c.json"
    assert sr.merge([a, c])["warnings"] == ["the runs differ in device: GPU, another GPU"]
    with pytest.raises(sr.MergeError, match="no run files"):
        sr.merge([])


def test_a_file_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"kind": "benchmark", "results": []}))
    with pytest.raises(sr.MergeError, match="is not a sweep run's file"):
        sr.load_runs([tmp_path / "x.json"])


# --------------------------------------------------------------------------------------------------
# Worst ratios, noise and targets from hand-written rows

A, B, C, D = (
    "large:bfloat16:131072x2048",
    "large:bfloat16:65536x4096",
    "large:bfloat16:174763x1536",
    "large:bfloat16:8192x32768",
)
FWD, FWD_BWD = bm.FWD, bm.FWD_BWD


def synthetic_rows():
    """Four points. A and B: fit; C: report (1536 = 3 x 512); D: outside. Times in us."""
    return [
        sweep_row(A, "triton", FWD, gpu=270, whole=280, host=30, pct=90.0),
        sweep_row(A, "compile", FWD, gpu=250, whole=300, host=60),
        sweep_row(A, "F.rms_norm", FWD, gpu=400, whole=410, host=20),
        sweep_row(A, "triton", FWD_BWD, gpu=700, whole=720, host=200, pct=86.0),
        sweep_row(A, "compile", FWD_BWD, gpu=750, whole=800, host=500),
        sweep_row(A, "F.rms_norm", FWD_BWD, gpu=900, whole=950, host=100),
        sweep_row(B, "triton", FWD, gpu=260, whole=265, host=25, pct=96.0),
        sweep_row(B, "compile", FWD, gpu=270, whole=280, host=70),
        sweep_row(B, "F.rms_norm", FWD, gpu=390, whole=395, host=20),
        sweep_row(B, "triton", FWD_BWD, gpu=650, whole=660, host=150, pct=88.0),
        sweep_row(B, "compile", FWD_BWD, gpu=700, whole=710, host=400),
        sweep_row(B, "F.rms_norm", FWD_BWD, gpu=850, whole=860, host=100),
        sweep_row(C, "triton", FWD, gpu=300, whole=310, host=40, pct=80.0),
        sweep_row(C, "liger", FWD, gpu=290, whole=320, host=90),
        sweep_row(C, "F.rms_norm", FWD, gpu=380, whole=385, host=20),
        sweep_row(C, "triton", FWD_BWD, gpu=800, whole=810, host=300, pct=75.0),
        sweep_row(C, "liger", FWD_BWD, ok=False),  # failed its check: no peer there
        sweep_row(C, "F.rms_norm", FWD_BWD, gpu=904, whole=905, host=100),
        sweep_row(D, "triton", FWD, gpu=262, whole=270, host=30, pct=93.0, origin="outside"),
        sweep_row(D, "compile", FWD, gpu=300, whole=310, host=60, origin="outside"),
        sweep_row(D, "triton", FWD_BWD, gpu=700, whole=720, host=200, pct=80.0, origin="outside"),
        sweep_row(D, "compile", FWD_BWD, gpu=690, whole=700, host=450, origin="outside"),
        # B measured again by a second run: Triton 5% slower, compile 10% slower
        sweep_row(B, "triton", FWD, gpu=273, whole=291.5, host=25, pct=91.0, repeat=1, session=1),
        sweep_row(B, "compile", FWD, gpu=297, whole=294, host=70, repeat=1, session=1),
    ]


def synthetic_merged():
    # no copy measurements: the rows keep their hand-written shares of the ceiling
    run1 = sweep_run([r for r in synthetic_rows() if r["session"] == 0], part="1/2", ceilings=[])
    run2 = sweep_run([r for r in synthetic_rows() if r["session"] == 1], part="2/2", ceilings=[])
    run1["file"], run2["file"] = "p1.json", "p2.json"
    return sr.merge([run1, run2])


def test_worst_ratio_table_from_hand_written_rows():
    s = sr.summarize(synthetic_merged())
    table = {(e["regime"], e["group"], e["mode"]): e for e in s["worst"]}
    assert list(table) == [
        ("large", "fit", FWD),
        ("large", "fit", FWD_BWD),
        ("large", "report", FWD),
        ("large", "report", FWD_BWD),
        ("large", "outside", FWD),
        ("large", "outside", FWD_BWD),
    ]
    e = table[("large", "fit", FWD)]  # A: 250 / 270; B: 270 / 260. Whole: A 300 / 280, B 280 / 265
    assert e["points"] == 2
    assert (
        e["worst_vs_peer_gpu"] == pytest.approx(0.9259, abs=1e-4)
        and e["worst_vs_peer_gpu_at"] == "bfloat16 131072x2048, compile"
    )
    assert (
        e["worst_vs_peer_whole"] == pytest.approx(1.0566, abs=1e-4)
        and e["worst_vs_peer_whole_at"] == "bfloat16 65536x4096, compile"
    )
    assert e["worst_pct"] == 90.0 and e["worst_pct_at"] == "bfloat16 131072x2048" and e["median_pct"] == 93.0
    e = table[("large", "fit", FWD_BWD)]  # A: 750 / 700; B: 700 / 650. Whole: A 800 / 720, B 710 / 660
    assert e["worst_vs_peer_gpu"] == pytest.approx(1.0714, abs=1e-4) and e["worst_vs_peer_whole"] == pytest.approx(
        1.0758, abs=1e-4
    )
    assert e["worst_pct"] == 86.0 and e["median_pct"] == 87.0
    e = table[("large", "report", FWD_BWD)]  # liger failed its check: F.rms_norm is the fastest peer, 904 / 800
    assert (
        e["worst_vs_peer_gpu"] == pytest.approx(1.13)
        and e["worst_vs_peer_gpu_at"] == "bfloat16 174763x1536, F.rms_norm"
    )
    e = table[("large", "outside", FWD_BWD)]  # D: 690 / 700
    assert e["worst_vs_peer_gpu"] == pytest.approx(0.9857, abs=1e-4) and e["worst_pct"] == 80.0
    md = sr.markdown(synthetic_merged(), s)
    assert (
        "| large | fit | fwd | 2 | 0.93 | bfloat16 131072x2048, compile | 1.06 | bfloat16 65536x4096, compile | 90% "
        "| bfloat16 131072x2048 | 93% |"
    ) in md
    assert "| large | report | fwd+bwd | 1 | 1.13 | bfloat16 174763x1536, F.rms_norm | 1.12 |" in md


def test_the_merge_takes_each_runs_fastest_copy_as_its_ceiling():
    # a copy captured in a CUDA graph ran at 2.68 TB/s (the copy engines), the copy kernel at 4.1: a row of
    # 2.05 TB/s is at 50% of the ceiling, not 76%
    ceiling = dict(
        regime="large",
        when="start",
        bytes=2 << 29,
        whole_us=262.0,
        gpu_us=400.6,
        gpu_method="cuda-graph",
        gpu_note="",
        whole_tbps=4.1,
        gpu_tbps=2.68,
    )
    row = sweep_row(A, "triton", FWD, gpu=262, whole=270, host=30, pct=76.0)
    row["gpu_tbps"] = 2.05
    (merged_row,) = sr.merge([dict(sweep_run([row], ceilings=[ceiling]), file="p.json")])["rows"]
    assert merged_row["ceiling_tbps"] == 4.1 and merged_row["pct_of_ceiling"] == pytest.approx(50.0)


def test_noise_is_the_spread_of_points_measured_twice():
    noise = sr.summarize(synthetic_merged())["noise"]
    spreads = {(e["point"], e["impl"], e["mode"]): (e["gpu_spread"], e["whole_spread"]) for e in noise["entries"]}
    assert spreads.keys() == {(B, "triton", FWD), (B, "compile", FWD)}
    assert spreads[(B, "triton", FWD)] == pytest.approx((0.05, 0.10))  # 273 / 260, 291.5 / 265
    assert spreads[(B, "compile", FWD)] == pytest.approx((0.10, 0.05))  # 297 / 270, 294 / 280
    assert noise["stated_gpu"] == pytest.approx(0.10) and noise["stated_whole"] == pytest.approx(0.10)
    fwd = noise["by_mode"][FWD]
    assert fwd["series"] == 2 and fwd["measurements"] == 4 and fwd["gpu_median"] == pytest.approx(0.075)
    assert noise["by_mode"][FWD_BWD]["series"] == 0


def test_targets_and_their_misses_from_hand_written_rows():
    targets = sr.summarize(synthetic_merged())["targets"]
    assert [t["target"].split(":")[0] for t in targets] == ["large regime, N 2048-16384, every dtype"] * 2 + [
        "every sweep point, both regimes",
        "shapes outside the sweep (between its points and N > 16384)",
        "host time per call at most 1.5x F.rms_norm's (whole call, issue 9)",
        "the Triton path is right at every point (float64 oracle)",
    ]
    fwd, fwd_bwd = targets[0], targets[1]
    assert (fwd["checked"], fwd["met"]) == (2, 1) and [m["point"] for m in fwd["misses"]] == [
        A
    ]  # 90% < 92%; C's N is 1536
    assert (fwd_bwd["checked"], fwd_bwd["met"]) == (2, 2)  # 86% and 88% >= 85%
    peers, outside, host, right = targets[2], targets[3], targets[4], targets[5]
    # A fwd 0.93 and C fwd 0.97 are slower than a peer, but within the stated noise of 10%
    assert (peers["checked"], peers["met"], peers["within_noise"], peers["misses"]) == (6, 6, 2, [])
    assert (outside["checked"], outside["met"], outside["within_noise"]) == (2, 2, 1)  # D fwd+bwd 0.99
    # host time against F.rms_norm's: A fwd 1.5 (met), A fwd+bwd 2.0, C fwd 2.0, C fwd+bwd 3.0; D has no F.rms_norm
    assert (host["checked"], host["met"]) == (6, 3)
    assert sorted((m["point"], m["mode"]) for m in host["misses"]) == [(A, FWD_BWD), (C, FWD), (C, FWD_BWD)]
    assert (right["checked"], right["met"]) == (8, 8)
    assert "within the noise" in sr.markdown(synthetic_merged())


def test_a_peer_faster_beyond_the_noise_is_a_miss():
    rows = [sweep_row(A, "triton", FWD, gpu=300, pct=80.0), sweep_row(A, "compile", FWD, gpu=200)]
    targets = sr.targets(sr.triton_ratios(rows), noise=0.05)
    miss = targets[2]["misses"]
    assert len(miss) == 1 and miss[0]["value"] == pytest.approx(2 / 3) and "compile" in miss[0]["why"]


def test_the_sweep_figure_draws_every_panel(tmp_path):
    path = tmp_path / "benchmark-sweep.json"
    path.write_text(json.dumps(synthetic_merged()))
    result = figures.sweep_figure(path, tmp_path / "s.png")
    assert result.status == "written" and (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"fwd large/sweep triton bfloat16", "fwd+bwd large/outside compile bfloat16"} <= set(result.series)
    assert "liger" not in " ".join(s for s in result.series if "fwd+bwd" in s)  # its failed row has no point
    untimed = tmp_path / "untimed.json"
    untimed.write_text(
        json.dumps(sweep_run(_tiny_rows(sw.sweep_points("tiny")[0].id), shapes="tiny") | {"kind": "benchmark-sweep"})
    )
    assert figures.sweep_figure(untimed, tmp_path / "u.png").status == "skipped"
    assert figures.sweep_figure(tmp_path / "absent.json", tmp_path / "a.png").status == "skipped"


# --------------------------------------------------------------------------------------------------
# The command


def test_plan_prints_the_estimate_and_the_part_on_any_machine(capsys):
    rc, out, _ = run_cli(capsys, "benchmark-sweep", "--plan", "--part", "2/2")
    assert rc == 0
    assert "109 points (52 fit, 57 report) in 2 part(s)" in out and "torch.compile graphs" in out
    assert out.count(" noise repeat\n") == 4 and "4 noise repeat(s)" in out


@no_gpu_only
def test_without_a_gpu_only_the_tiny_sweep_runs(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "benchmark-sweep", "--outputs", tmp_path)
    assert rc == 2 and err.strip().splitlines()[-1].startswith("sweep: no CUDA GPU here")
    assert "not --shapes sweep" in err and list(tmp_path.iterdir()) == []
    rc, _, err = run_cli(capsys, "benchmark-sweep", "--shapes", "tiny", "--require-gpu", "--outputs", tmp_path)
    assert rc == 2 and list(tmp_path.iterdir()) == []


@no_gpu_only
def test_tiny_sweep_in_two_parts_then_merged(tmp_path, capsys):
    for part in ("1/2", "2/2"):
        rc, out, err = run_cli(capsys, "benchmark-sweep", "--shapes", "tiny", "--part", part, "--outputs", tmp_path)
        assert rc == 0, out + err
        assert "correctness only" in err
    runs = sorted(tmp_path.glob("benchmark-sweep.part*.json"))
    assert [p.name for p in runs] == ["benchmark-sweep.part1of2.json", "benchmark-sweep.part2of2.json"]
    first = json.loads(runs[0].read_text())
    assert first["complete"] and first["timed"] is False and first["part"] == "1/2" and first["ceilings"] == []
    rc, out, _ = run_cli(capsys, "benchmark-sweep", "--merge", "--outputs", tmp_path)
    assert rc == 0 and "## Worst ratios" in out
    merged = json.loads((tmp_path / "benchmark-sweep.json").read_text())
    assert merged["missing"] == [] and len(merged["runs"]) == 2
    impls = {"triton", "reference", "F.rms_norm"}
    assert {r["impl"] for r in merged["rows"]} == impls and all(r["ok"] for r in merged["rows"])
    assert sum(r["repeat"] == 0 for r in merged["rows"]) == 4 * 3 * 2  # four points, three impls, two directions
    assert sum(r["repeat"] == 1 for r in merged["rows"]) == 2 * 3 * 2  # each run repeated the noise point
    assert (tmp_path / "benchmark-sweep.md").read_text().startswith("# Benchmark sweep")
    assert not (tmp_path / "figures" / "benchmark_sweep.png").exists()  # no timings: no figure


@no_gpu_only
def test_skip_done_runs_only_what_an_earlier_run_left(tmp_path, capsys):
    ids = [p.id for p in sw.sweep_points("tiny")]
    earlier = tmp_path / "earlier.json"
    earlier.write_text(
        json.dumps(sweep_run(_tiny_rows(ids[0]) + _tiny_rows(ids[1]) + _tiny_rows(ids[2], repeat=1), shapes="tiny"))
    )
    rc, out, _ = run_cli(
        capsys, "benchmark-sweep", "--shapes", "tiny", "--skip-done", earlier, "--no-noise", "--outputs", tmp_path
    )
    assert rc == 0, out
    data = json.loads((tmp_path / "benchmark-sweep.part1of1.after2.json").read_text())
    assert data["skipped_done"] == 2 and sorted({r["point"] for r in data["rows"]}) == sorted(ids[2:])
    rc, _, err = run_cli(capsys, "benchmark-sweep", "--merge", tmp_path / "absent.json", "--outputs", tmp_path)
    assert rc == 2 and "is not a sweep run's file" in err


def test_a_signal_stops_the_sweep_after_the_point_in_progress_and_keeps_what_it_measured():
    import os
    import signal

    points = sw.sweep_points("tiny")[:3]
    written = []
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job

    def factory(name, device):
        if name == "triton" and not written:  # during the first point: Ctrl+C
            os.kill(os.getpid(), signal.SIGINT)
        return bm.make_impl(name, device)

    with sw.stop_on_signal() as stop:
        rows, _, remaining = sw.run_part(
            points,
            [],
            ["triton"],
            DEVICE,
            sm.NoTimers(),
            write=lambda *a: written.append(a),
            impl_factory=factory,
            log=lambda line: None,
            stop=stop,
        )
    assert stop() == "SIGINT"  # no KeyboardInterrupt inside the first point: it ended, and was written
    assert {r.point for r in rows} == {points[0].id} and all(r.ok for r in rows)
    assert remaining == points[1:] and len(written) == 2  # after the point, and the final write
    assert signal.getsignal(signal.SIGINT) is before  # given back


def test_running_a_part_again_keeps_the_earlier_runs_file_out_of_the_merge(tmp_path):
    path = sw.part_path(tmp_path, 1, 2)
    assert sw.keep_previous(path) is None  # nothing there yet
    for run in ("first", "second"):
        path.write_text(run)
        sw.keep_previous(path)
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "benchmark-sweep.part1of2.json.prev1",
        "benchmark-sweep.part1of2.json.prev2",
    ]
    assert [p.read_text() for p in sorted(tmp_path.iterdir())] == ["first", "second"]
    assert sorted(tmp_path.glob("benchmark-sweep.part*.json")) == []  # what --merge reads by default
