"""``python -m benchmarks.residual_add`` on the CPU, in-process: what it measures is checked against the
oracle first, its table, and its refusals (never how fast)."""

import json

import pytest
import torch

from benchmarks import residual_add
from tests.helpers import markdown_rows


def test_every_implementation_passes_its_check_and_is_timed_in_both_directions(device):
    timed = []
    rows = residual_add.measure((4, 64), device, lambda fn: timed.append(fn()) or {"gpu_ms": 1.5})
    impls = [name for name in residual_add.implementations()]
    assert [(r["impl"], r["direction"]) for r in rows] == [(i, d) for i in impls for d in residual_add.DIRECTIONS]
    assert all(r["problem"] is None and r["gpu_ms"] == 1.5 for r in rows)
    assert {"triton", "compile", "eager"} <= set(impls) and len(timed) == len(rows)


def test_repeats_time_every_implementation_in_rounds_and_keep_the_medians(device):
    """Round r times every implementation once before round r + 1 starts; a row holds the median."""
    order = []

    def timer(fn):
        order.append(fn)
        return {"gpu_ms": float(len(order)), "gpu_method": "fake"}  # 1, 2, 3, ... in call order

    rows = residual_add.measure((4, 64), device, timer, repeats=3)
    per_round = len(rows)
    assert len(order) == 3 * per_round and order[:per_round] == order[per_round : 2 * per_round]
    for i, row in enumerate(rows):
        times = [1.0 + i + k * per_round for k in range(3)]  # this row's call in each round
        assert row["gpu_ms_samples"] == times and row["gpu_ms"] == times[1] and row["gpu_method"] == "fake"


def test_repeats_below_one_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        residual_add.main(["--repeats", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeats" in err[0] and "1 or more" in err[0]


def test_an_implementation_off_the_oracle_is_named_and_still_timed(device, monkeypatch):
    real = residual_add.implementations

    def with_a_wrong_one():
        impls = real()
        fn, mode = impls["eager"]
        impls["eager"] = (lambda x, r, g: (fn(x, r, g)[0] * 1.05, fn(x, r, g)[1]), mode)  # y off: both directions
        return impls

    monkeypatch.setattr(residual_add, "implementations", with_a_wrong_one)
    rows = residual_add.measure((4, 64), device, lambda fn: {"gpu_ms": 1.0})
    wrong = [r for r in rows if r["impl"] == "eager"]
    assert all(r["gpu_ms"] == 1.0 and r["problem"].startswith("y off the oracle by ") for r in wrong)
    assert all(r["problem"] is None for r in rows if r["impl"] != "eager")


def test_table_marks_the_fastest_and_a_failed_check(tmp_path, capsys):
    rows = [
        dict(shape=[8, 16], impl="triton", direction="fwd", gpu_ms=1.0, problem=None),
        dict(shape=[8, 16], impl="compile", direction="fwd", gpu_ms=2.0, problem=None),
        dict(shape=[8, 16], impl="liger", direction="fwd", gpu_ms=0.5, problem="y off the oracle"),
        dict(shape=[8, 16], impl="eager", direction="fwd", gpu_ms=None, problem="y off the oracle"),
    ]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(dtype="bfloat16", rows=rows)))
    assert residual_add.main(["--table", str(path)]) == 0
    rows = markdown_rows(capsys.readouterr().out)
    assert rows[0] == ["rows x N (bfloat16)", "direction", "triton", "compile", "liger", "eager"]
    # the fastest result on its oracle is bold, not a faster one off it
    assert rows[1] == ["8 x 16", "fwd", "**1.000**", "2.000", "0.500 †", "failed its check, not timed"]


def test_table_gives_the_whole_call_beside_the_gpu_time(tmp_path, capsys):
    rows = [
        dict(shape=[8, 16], impl="triton", direction="fwd", gpu_ms=1.0, whole_ms=2.5, problem=None),
        dict(shape=[8, 16], impl="compile", direction="fwd", gpu_ms=2.0, whole_ms=2.25, problem=None),
    ]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(dtype="bfloat16", rows=rows)))
    assert residual_add.main(["--table", str(path)]) == 0
    assert markdown_rows(capsys.readouterr().out)[1] == ["8 x 16", "fwd", "**1.000** / 2.50", "2.000 / 2.25"]


@pytest.mark.parametrize(
    "content",
    ["not json", json.dumps({"rows": [{"shape": [1]}]}), json.dumps({"dtype": "bfloat16", "rows": []})],
    ids=["not json", "rows of another kind", "no rows"],
)
def test_table_of_a_file_that_is_not_its_results_is_one_line_and_exit_2(content, tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert residual_add.main(["--table", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"residual_add: --table {path}: not a results file")


def test_table_of_a_missing_file_says_it_cannot_be_read(tmp_path, capsys):
    assert residual_add.main(["--table", str(tmp_path / "absent.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"residual_add: --table {tmp_path / 'absent.json'} cannot be read (No such file or directory)"
    )


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("what the command does without a GPU")
    assert residual_add.main(["--json", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "residual_add: needs a CUDA GPU (on the CPU the kernels run in Triton's interpreter); none found."
    )
    assert not (tmp_path / "r.json").exists()


def test_its_default_results_file_is_one_clean_removes(tmp_path):
    from rmsnorm_kernel.checks import generated

    path = "outputs/residual_add.json"
    assert residual_add.DEFAULT_JSON == path and generated.is_generated_file(tmp_path, path)
    assert generated.is_generated_file(tmp_path, path + ".prev1")  # an earlier run's, kept when it ran again


def test_a_backward_off_the_oracle_marks_only_the_forward_and_backward_row(device, monkeypatch):
    real = residual_add.implementations

    def with_a_wrong_backward():
        impls = real()
        fn, mode = impls["eager"]

        def off_backward(x, r, g):
            y, h = fn(x, r, g)
            return y + 0.05 * (x - x.detach()), h  # the same values; dx off by 5%

        impls["eager"] = (off_backward, mode)
        return impls

    monkeypatch.setattr(residual_add, "implementations", with_a_wrong_backward)
    rows = {(r["impl"], r["direction"]): r for r in residual_add.measure((4, 64), device, lambda fn: {"gpu_ms": 1.0})}
    assert rows[("eager", "fwd")]["problem"] is None
    assert rows[("eager", "fwd+bwd")]["problem"].startswith("dx off the oracle by ")


def test_an_interrupted_write_is_one_clean_removes_too(tmp_path):
    from rmsnorm_kernel.atomic import temporary_path
    from rmsnorm_kernel.checks import generated

    for name in ("residual_add.json", "train_step.json", "transformer_step.json"):
        staged = temporary_path(tmp_path / "outputs" / name)
        assert generated.is_generated_file(tmp_path, staged.relative_to(tmp_path).as_posix()), staged
