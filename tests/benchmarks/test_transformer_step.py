"""``python -m benchmarks.transformer_step`` on the CPU, in-process: its options, the split of a profile by
what each kernel computes, its table, and the training step it profiles (never how fast)."""

import json
import math

import pytest
import torch

from benchmarks import transformer_step
from rmsnorm_kernel.ops import counters
from rmsnorm_kernel.ops.tolerances import TOLERANCES
from rmsnorm_kernel.training.network import norm_calls_per_step
from tests.helpers import markdown_rows

#: A language model small enough for Triton's interpreter.
SMALL = dict(dim=32, layers=2, heads=2, mlp_hidden=64, seq_len=16, qk_norm=True, lr=1e-3, batch_size=2)
OWN = transformer_step.project_kernels()


def test_the_defaults_profile_every_path_compiled():
    args = transformer_step.parse_args([])
    assert args.paths == ["reference", "native", "triton"] and args.modes == ["compile"]
    assert (args.steps, args.warmup) == (20, 5) and str(args.json) == "outputs/transformer_step.json"


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(transformer_step.torch.cuda, "is_available", lambda: False)
    assert transformer_step.main(["--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["transformer_step: needs a CUDA GPU (profiled kernels); none found."]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "name, expected",
    [  # names from an H200 profile of the compiled step
        ("_rmsnorm_bwd_kernel", "norm"),
        ("_dgamma_column_sum_kernel", "norm"),
        ("triton_per_fused__fused_rms_norm__fused_rms_norm_backward_add_view_3", "norm"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
        (
            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
            "attention",
        ),
        ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", "attention"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous", "optimizer"),
        ("triton_poi_fused_add_view_2", "other"),  # an add Inductor could not fuse into an opaque op
        ("triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_1", "other"),
    ],
)
def test_each_kernel_falls_in_the_category_its_name_says(name, expected):
    assert transformer_step.category(name, OWN) == expected


def test_a_profile_is_split_per_step_with_copies_apart():
    events = [("_rmsnorm_fwd_kernel", 10.0), ("_rmsnorm_fwd_kernel", 14.0), ("nvjet_x", 100.0),
              ("triton_poi_fused_add_view_2", 6.0), ("Memcpy HtoD (Pageable -> Device)", 50.0)]  # fmt: skip
    s = transformer_step.split(events, 2, OWN)
    assert s["category_ms"] == {"norm": 0.012, "gemm": 0.05, "attention": 0.0, "optimizer": 0.0, "other": 0.003}
    assert math.isclose(s["gpu_ms"], 0.065) and s["kernels_per_step"] == 2.0
    assert [k["name"] for k in s["kernels"]] == ["nvjet_x", "_rmsnorm_fwd_kernel", "triton_poi_fused_add_view_2"]


def test_the_sizes_are_read_from_a_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "model:\n  kind: transformer\n  dim: 48\n  layers: 3\n  heads: 4\n  mlp_hidden: 96\n  seq_len: 8\n"
        "  qk_norm: true\n  lr: 2.0e-3\ndata:\n  batch_size: 5\n"
    )
    assert transformer_step.load_sizes(preset) == dict(
        dim=48, layers=3, heads=4, mlp_hidden=96, seq_len=8, qk_norm=True, lr=2e-3, batch_size=5
    )


def test_every_path_starts_from_the_same_network_and_batch_and_triton_runs_every_norm(device):
    first = {}
    for path in ("reference", "native", "triton"):
        step = transformer_step.make_step(path, "eager", SMALL, device, dtype="float32")
        before = counters.call_counts()
        first[path] = step().item()
        after = counters.call_counts()
        norms = norm_calls_per_step("transformer", SMALL["layers"], SMALL["qk_norm"])
        calls = {k: after[k] - before[k] for k in before}
        assert calls == ({"forward": norms, "backward": norms} if path == "triton" else {"forward": 0, "backward": 0})
    tol = TOLERANCES[torch.float32]
    for path in ("native", "triton"):
        assert math.isclose(first[path], first["reference"], rel_tol=tol.rtol, abs_tol=tol.atol), first


def test_a_run_writes_every_row_and_running_again_keeps_the_earlier_results(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(transformer_step.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(transformer_step.torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(transformer_step.torch.cuda, "empty_cache", lambda: None)
    seen = []

    def measure(path, mode, sizes, steps, warmup, own):
        seen.append((path, mode, steps, warmup))
        split = transformer_step.split([("nvjet_x", 1000.0)], 1, own)
        return dict(path=path, mode=mode, wall_ms=1.5, error=None, **split)

    monkeypatch.setattr(transformer_step, "measure", measure)
    out = tmp_path / "r.json"
    argv = ["--paths", "native,triton", "--steps", "3", "--warmup", "2", "--json", str(out)]
    assert transformer_step.main(argv) == 0
    assert seen == [("native", "compile", 3, 2), ("triton", "compile", 3, 2)]
    data = json.loads(out.read_text())
    assert data["complete"] and data["sizes"] == transformer_step.load_sizes() and len(data["rows"]) == 2
    assert transformer_step.main(argv) == 0
    assert json.loads((tmp_path / "r.json.prev1").read_text()) == data
    assert f"held an earlier run; kept as {out}.prev1" in capsys.readouterr().out


def test_table_prints_a_results_file_and_refuses_another(tmp_path, capsys):
    row = dict(path="triton", mode="compile", wall_ms=78.7, gpu_ms=77.5, kernels_per_step=461, error=None,
               category_ms=dict(norm=3.77, gemm=43.0, attention=19.2, optimizer=1.8, other=9.7))  # fmt: skip
    failed = dict(path="native", mode="compile", error="compile failed")
    good = tmp_path / "r.json"
    good.write_text(json.dumps(dict(kind="transformer_step", rows=[row, failed])))
    assert transformer_step.main(["--table", str(good)]) == 0
    rows = markdown_rows(capsys.readouterr().out)
    assert rows[1] == ["triton", "compile", "78.70", "77.50", "3.77", "43.00", "19.20", "1.80", "9.70", "461"]
    assert rows[2] == ["native", "compile", "failed: compile failed"] + [""] * 7
    other = tmp_path / "o.json"
    other.write_text(json.dumps(dict(kind="train_step", rows=[])))
    assert transformer_step.main(["--table", str(other)]) == 2
    assert "not a transformer_step result" in capsys.readouterr().err


def test_its_default_results_file_is_one_clean_removes(tmp_path):
    from rmsnorm_kernel.checks import generated

    assert generated.is_generated_file(tmp_path, transformer_step.DEFAULT_JSON.as_posix())
    earlier = transformer_step.DEFAULT_JSON.as_posix() + ".prev2"  # an earlier run's, kept
    assert generated.is_generated_file(tmp_path, earlier)
