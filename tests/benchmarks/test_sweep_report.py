"""Merging the sweep's run files, and what the merged rows say: worst ratios, noise, targets, markdown.

Every time here is hand-written; nothing is measured.
"""

import json

import pytest

from benchmarks.impls import FWD, FWD_BWD
from benchmarks.sweep import report as sr
from benchmarks.sweep.points import sweep_points
from tests.helpers import markdown_rows

from .helpers import sweep_row, sweep_run, tiny_rows


def test_runs_merge_into_one_file_with_repeats_and_missing_points_named():
    ids = [p.id for p in sweep_points("tiny")]
    run1 = sweep_run(tiny_rows(ids[0]) + tiny_rows(ids[1]) + tiny_rows(ids[0], repeat=1), shapes="tiny")
    run2 = sweep_run(tiny_rows(ids[2]) + tiny_rows(ids[0]), shapes="tiny", date="2026-01-02")  # ids[0] again
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
    assert [r["file"] for r in merged["runs"]] == ["run0.json", "run1.json"] and merged["warnings"] == []
    assert [r["points"] for r in merged["runs"]] == [2, 2]


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
    with pytest.raises(sr.MergeError, match="is not a sweep results file .*before any run's line"):
        sr.load_runs([tmp_path / "x.json"])


# --------------------------------------------------------------------------------------------------
# Worst ratios, noise and targets from hand-written rows

A, B, C, D = (
    "large:bfloat16:131072x2048",
    "large:bfloat16:65536x4096",
    "large:bfloat16:174763x1536",
    "large:bfloat16:8192x32768",
)
FWD, FWD_BWD = FWD, FWD_BWD


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
    run1 = sweep_run([r for r in synthetic_rows() if r["session"] == 0], ceilings=[])
    run2 = sweep_run([r for r in synthetic_rows() if r["session"] == 1], ceilings=[])
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
    md = markdown_rows(sr.markdown(synthetic_merged(), s))
    assert [
        *("large", "fit", "fwd", "2", "0.93", "bfloat16 131072x2048, compile", "1.06", "bfloat16 65536x4096, compile"),
        *("90%", "bfloat16 131072x2048", "93%"),
    ] in md
    assert any(
        r[:7] == ["large", "report", "fwd+bwd", "1", "1.13", "bfloat16 174763x1536, F.rms_norm", "1.12"] for r in md
    )


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
    assert [t["target"].split(":")[0] for t in targets] == [
        "forward ≥ 92% of the copy ceiling at N 2048-16384 (large regime, every dtype, GPU time)",
        "forward + backward ≥ 85% of the copy ceiling at N 2048-16384 (large regime, every dtype, GPU time)",
        "every sweep point, both regimes",
        "shapes outside the sweep (between its points and N > 16384)",
        "forward ≥ 90% of the copy ceiling at N 512-65536, x of 64 MiB or more (GPU time)",
        "forward + backward ≥ 85% of the copy ceiling at N 512-16384, x of 64 MiB or more (GPU time)",
        "forward + backward ≥ 80% of the copy ceiling at N 16385-65536, x of 64 MiB or more (GPU time)",
        "the shapes users run beyond the sweep (narrow rows, activation-sized x, small batches, wide rows, the "
        "benchmark's small shapes)",
        "host time per call at most 1.5x F.rms_norm's (whole call)",
        "the Triton path is right at every point (float64 oracle)",
    ]
    fwd, fwd_bwd = targets[0], targets[1]
    assert (fwd["checked"], fwd["met"]) == (2, 1) and [m["point"] for m in fwd["misses"]] == [
        A
    ]  # 90% < 92%; C's N is 1536
    assert (fwd_bwd["checked"], fwd_bwd["met"]) == (2, 2)  # 86% and 88% >= 85%
    peers, outside, host, right = targets[2], targets[3], targets[8], targets[9]
    # every point here is activation-sized (512 MiB): A 90, B 96, C 80, D 93 forward; C misses 90%
    act_fwd, act_fwd_bwd, act_wide, beyond = targets[4], targets[5], targets[6], targets[7]
    assert (act_fwd["checked"], act_fwd["met"]) == (4, 3) and [m["point"] for m in act_fwd["misses"]] == [C]
    assert (act_fwd_bwd["checked"], act_fwd_bwd["met"]) == (3, 2)  # A 86, B 88 >= 85; C 75
    assert (act_wide["checked"], act_wide["met"]) == (1, 1)  # D, N = 32768: 80 >= 80
    assert beyond["checked"] == 0  # no point of those origins here
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


def test_the_markdown_names_each_run_file_and_says_when_nothing_was_timed():
    ids = [p.id for p in sweep_points("tiny")]
    run = dict(sweep_run(tiny_rows(ids[0]), shapes="tiny"), timed=False, complete=False, file="/x/a.json")
    md = sr.markdown(sr.merge([run]))
    assert md.startswith("# Benchmark sweep: GPU\n")
    assert "- `a.json` (2026-01-01T00:00:00+00:00): 1 points, 100 s, INCOMPLETE" in md
    assert "No timings: these runs had no CUDA GPU" in md
    assert f"points missing from the runs: 3 ({', '.join(ids[1:])})" in md


def test_the_merged_files_are_written_with_the_summary(tmp_path):
    json_path, md_path = sr.write_merged(synthetic_merged(), tmp_path)
    data = json.loads(json_path.read_text())
    assert json_path.name == sr.MERGED_JSON and md_path.name == sr.MERGED_MD
    assert data["kind"] == sr.MERGED_KIND and {"noise", "worst", "targets", "rows"} <= set(data)
    assert md_path.read_text() == sr.markdown(synthetic_merged())
