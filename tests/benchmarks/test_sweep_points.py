"""The sweep's points: hidden sizes, dtypes, regimes, the shapes outside it, the split and the hash."""

import dataclasses

import pytest
import torch

from benchmarks.impls import FWD, FWD_BWD
from benchmarks.rows import bytes_moved
from benchmarks.sweep import points as sp

MiB = 1 << 20
#: float16 and float32 points, written out: every fourth N of the sorted sweep from the fourth on.
OTHER_DTYPE_NS = {2048, 4096, 5632, 7680, 9728, 11264, 13312, 15360}


def test_hidden_sizes_are_every_multiple_of_512_from_1024_to_16384_and_three_more():
    ns = sp.sweep_ns()
    assert len(ns) == 34 and ns == sorted(ns)
    assert [n for n in ns if n % 512 == 0] == list(range(1024, 16385, 512))  # 31 multiples
    assert [n for n in ns if n % 512] == [1000, 4097, 10000]


def test_bfloat16_everywhere_and_the_other_dtypes_at_every_fourth_point():
    points = sp.sweep_points()
    for regime in ("large", "mid"):
        of = lambda dt, regime=regime: [  # noqa: E731
            p.N for p in points if p.regime == regime and p.origin == "sweep" and p.dtype == dt
        ]
        assert of("bfloat16") == sp.sweep_ns()
        assert set(of("float16")) == set(of("float32")) == OTHER_DTYPE_NS
        assert len(of("float16")) == len(of("float32")) == 8
    # both splits have points in every dtype
    others = [p for p in points if p.origin == "sweep" and p.dtype != "bfloat16"]
    assert {p.N for p in others if p.split == "fit"} == {2048, 4096, 11264, 13312, 15360}
    assert {p.N for p in others if p.split == "report"} == {5632, 7680, 9728}


def test_each_regime_holds_its_bytes_in_x():
    points = sp.sweep_points()
    for p in points:
        if p.regime in sp.REGIME_BYTES:
            row_bytes = p.N * sp.itemsize(p.dtype)
            assert abs(p.x_bytes - sp.REGIME_BYTES[p.regime]) <= row_bytes / 2, p.id
    by_id = {p.id: p for p in points}
    # written out: 512 MiB / (4096 * 2) = 65536 rows; 32 MiB / (1000 * 2) = 16777.216; 512 MiB / (24576 * 4) = 5461.33
    assert {
        "large:bfloat16:65536x4096",
        "mid:bfloat16:16777x1000",
        "large:float32:5461x24576",
        "mid:float32:2048x4096",
        "large:bfloat16:4096x65536",
    } <= set(by_id)
    assert sp.REGIME_BYTES == {
        "large": 512 * MiB,
        "mid": 32 * MiB,
        "act64": 64 * MiB,
        "act128": 128 * MiB,
        "act256": 256 * MiB,
    }


def test_point_counts_outside_shapes_and_small_shapes():
    points = sp.sweep_points()
    assert len(points) == len({p.id for p in points}) == 109 + 55
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
    assert all(p.N not in sp.sweep_ns() or p.N > 16384 for p in points if p.origin == "outside")
    # the benchmark's small shapes stay; 4096x4096 float16 is the mid regime's own point
    assert [p.id for p in points if p.origin == "small"] == ["small:float32:128x257", "small:float32:32x257"]
    assert "mid:float16:4096x4096" in {p.id for p in points}


def test_fit_split_is_the_even_multiples_of_512_within_the_sweep():
    points = sp.sweep_points()
    fit = [p for p in points if p.split == "fit" and p.origin == "sweep"]
    assert all(p.N % 1024 == 0 for p in fit)
    assert len(fit) == 2 * (16 + 5 + 5)  # per regime: bfloat16 at 1024..16384 step 1024, and 5 N of each other dtype
    assert sp.Point("large", "sweep", 1, 1536, "bfloat16").split == "report"  # an odd multiple
    assert sp.Point("large", "sweep", 1, 4097, "bfloat16").split == "report"
    assert sp.Point("large", "outside", 1, 32768, "bfloat16").split == "report"  # even, but outside the sweep
    assert sum(p.split == "report" for p in points if p.origin in ("sweep", "outside", "small")) == 109 - 52


def test_the_shapes_users_run_narrow_activation_batch_and_wide():
    points = sp.sweep_points()
    of = lambda origin: [p for p in points if p.origin == origin]  # noqa: E731
    narrow = of("narrow")
    assert [p.N for p in narrow if p.dtype == "bfloat16"] == [64, 96, 128, 192, 256, 320, *range(384, 1025, 64)]
    assert [p.N for p in narrow if p.dtype == "float32"] == [128, 256]
    assert {p.regime for p in narrow} == {"act128"} and "act128:bfloat16:524288x128" in {p.id for p in narrow}
    assert {p.N for p in narrow if p.split == "fit"} == set(range(128, 1025, 128))  # the rest is judged on
    activation = of("activation")
    # 18 (N, size) pairs less act128 at N = 1024, which the narrow rows hold already
    assert len(activation) == 17 and "act256:bfloat16:32768x4096" in {p.id for p in activation}
    assert {p.regime for p in activation if p.split == "fit"} == {"act64", "act256"}
    batch = of("batch")
    assert {(p.M, p.N) for p in batch} == {(m, n) for m in (64, 256, 1024, 2048) for n in (256, 1024, 4096, 16384)}
    assert {p.M for p in batch if p.split == "fit"} == {64, 1024} and {p.regime for p in batch} == {"batch"}
    assert [(p.N, p.regime, p.split) for p in of("wide")] == [
        (20480, "large", "report"),
        (40960, "large", "report"),
        (49152, "large", "report"),
    ]


def test_noise_points_are_sweep_points():
    points = sp.sweep_points()
    noise = sp.noise_points(points)
    assert [p.id for p in noise] == [
        "large:bfloat16:65536x4096",
        "large:bfloat16:26844x10000",
        "mid:bfloat16:4096x4096",
        "mid:bfloat16:16777x1000",
    ]
    assert sp.noise_points(sp.sweep_points("tiny"), "tiny") == sp.sweep_points("tiny")[:1]


def test_definition_hash_names_the_list_of_points():
    copies = [dataclasses.replace(p) for p in sp.sweep_points()]  # equal points, other objects
    assert sp.definition_hash(sp.sweep_points()) == sp.definition_hash(copies)
    assert sp.definition_hash(sp.sweep_points()) != sp.definition_hash(sp.sweep_points()[:-1])
    with pytest.raises(ValueError, match="shapes is 'huge'"):
        sp.sweep_points("huge")


def test_the_byte_model_of_a_sweep_point():
    p = sp.Point("large", "sweep", 65536, 4096, "bfloat16")
    # forward: read x, write y (2 * 65536 * 4096 bf16) + read gamma (4096 bf16)
    assert bytes_moved(FWD, p.M, p.N, torch.bfloat16) == 1_073_741_824 + 8_192
    # forward + backward: x, y; x, dy, dx (5 * 65536 * 4096 bf16) + gamma, dgamma
    assert bytes_moved(FWD_BWD, p.M, p.N, torch.bfloat16) == 2_684_354_560 + 16_384
