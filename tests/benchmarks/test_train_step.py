"""``python -m benchmarks.train_step`` on the CPU, in-process: its options, its refusals, the rule that finds
the RMSNorm's kernels in a profile, its tables, and the training step it times (never how fast)."""

import json
import sys

import pytest
import torch

from benchmarks import train_step
from tests.helpers import ROOT, markdown_rows

#: A small network: the Triton path runs in Triton's interpreter on the CPU.
SMALL = dict(input_dim=8, hidden_dim=64, output_dim=4, lr=1e-3, batch_size=32)
#: The Triton path's kernels as kernels.py names them.
OWN = train_step.project_kernels()


# --------------------------------------------------------------------------------------------------
# Options


def test_the_defaults_are_every_dtype_and_mode_and_every_path_that_imports():
    args = train_step.parse_args([])
    assert args.dtypes == ["float32", "bfloat16"] and args.modes == ["eager", "compile", "reduce-overhead"]
    assert args.paths is None and args.steps == 100 and args.warmup == 10
    assert str(args.json) == "outputs/train_step.json" and args.table is None


def test_lists_are_taken_in_the_order_given_without_repeats():
    args = train_step.parse_args(
        ["--paths", "triton, native,triton", "--modes", "reduce-overhead", "--dtypes", "bfloat16"]
    )
    assert args.paths == ["triton", "native"] and args.modes == ["reduce-overhead"] and args.dtypes == ["bfloat16"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--paths", "triton,apex"],
            "unknown apex; accepted: a comma-separated subset of reference,native,triton,liger",
        ),
        (["--modes", "max-autotune"], "unknown max-autotune; accepted: a comma-separated subset of eager,compile,"),
        (["--dtypes", ","], "',' names no dtype; accepted"),
        (["--dtypes", "float16"], "unknown float16"),
        (["--steps", "0"], "argument --steps: 0 is too small"),
        (["--warmup", "0"], "argument --warmup: 0 is too small"),
        (["--steps", "ten"], "'ten' is not a number"),
        (["--count-steps", "3"], "unrecognized arguments: --count-steps 3"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2_before_any_work(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(train_step, "run", lambda args: pytest.fail("ran with bad arguments"))
    with pytest.raises(SystemExit) as exc:
        train_step.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("python -m benchmarks.train_step: ") and says in err[0], err


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train_step.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(train_step, "measure", lambda *a: pytest.fail("measured without a GPU"))
    assert train_step.main(["--json", str(tmp_path / "t.json")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0] == "train_step: needs a CUDA GPU (profiled kernels, CUDA graphs); none found."
    assert captured.out == "" and not (tmp_path / "t.json").exists()


def _as_if_on_a_gpu(monkeypatch, liger: bool):
    monkeypatch.setattr(train_step.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(train_step.torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(train_step.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(train_step, "liger_available", lambda: liger)


def test_asking_for_liger_where_it_does_not_import_is_refused_in_one_line(capsys, monkeypatch, tmp_path):
    _as_if_on_a_gpu(monkeypatch, liger=False)
    monkeypatch.setattr(train_step, "measure", lambda *a: pytest.fail("measured a refused run"))
    assert train_step.main(["--paths", "triton,liger", "--json", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train_step: --paths liger: liger_kernel does not import here; accepted: the other paths"]


# --------------------------------------------------------------------------------------------------
# The run, with a fake measurement


def fake_row(path, mode, dtype_name, sizes, steps, warmup, own, calls_ok=True, norm_ms=0.5, fused=False):
    """A row as ``measure`` returns it, with made-up numbers."""
    k = steps if path == "triton" else 0
    return dict(
        path=path,
        mode=mode,
        dtype=dtype_name,
        wall_ms=7.25,
        wall_min_ms=7.0,
        host_ms=1.5,
        gpu_ms=6.5,
        kernels_per_step=21.0,
        copies_per_step=0.0,
        norm_gpu_ms=norm_ms,
        norm_fused=fused,
        kernels=[],
        calls={"forward": k if calls_ok else k + 1, "backward": k},
        calls_ok=calls_ok,
        first_loss=1.1,
        last_loss=1.0,
        error=None,
    )


def test_a_run_measures_every_row_reads_the_preset_and_writes_its_json(tmp_path, capsys, monkeypatch):
    _as_if_on_a_gpu(monkeypatch, liger=False)
    seen = []

    def measure(path, mode, dtype_name, sizes, steps, warmup, own):
        seen.append((dtype_name, mode, path, sizes, steps, warmup))
        return fake_row(path, mode, dtype_name, sizes, steps, warmup, own)

    monkeypatch.setattr(train_step, "measure", measure)
    out = tmp_path / "out" / "t.json"
    argv = ["--steps", "7", "--warmup", "2", "--modes", "eager,compile", "--dtypes", "bfloat16", "--json", str(out)]
    assert train_step.main(argv) == 0
    sizes = train_step.load_sizes(train_step.PRESET)
    assert seen == [
        ("bfloat16", mode, path, sizes, 7, 2)
        for mode in ("eager", "compile")
        for path in ("reference", "native", "triton")
    ]
    data = json.loads(out.read_text())
    assert data["kind"] == "train_step" and data["complete"] and data["device"] == "fake GPU"
    assert data["sizes"] == sizes and data["preset"] == "conf/model/large.yaml" and data["steps"] == 7
    assert [(r["mode"], r["path"]) for r in data["rows"]] == [(m, p) for _, m, p, *_ in seen]
    stdout = capsys.readouterr().out
    assert "no liger rows" in stdout and "calls fwd/bwd in 7 steps" in stdout and "WRONG" not in stdout


def test_running_again_keeps_the_earlier_runs_results(tmp_path, capsys, monkeypatch):
    _as_if_on_a_gpu(monkeypatch, liger=False)
    monkeypatch.setattr(train_step, "measure", fake_row)
    out = tmp_path / "t.json"
    argv = ["--steps", "3", "--modes", "eager", "--dtypes", "float32", "--paths", "triton", "--json", str(out)]
    assert train_step.main(argv) == 0
    first = out.read_text()
    assert train_step.main(argv) == 0
    assert (tmp_path / "t.json.prev1").read_text() == first and json.loads(out.read_text())["complete"]
    assert f"held an earlier run; kept as {out}.prev1" in capsys.readouterr().out


def test_a_call_count_that_differs_is_shown_and_exits_1(tmp_path, capsys, monkeypatch):
    _as_if_on_a_gpu(monkeypatch, liger=False)

    def measure(path, *args):
        return fake_row(path, *args, calls_ok=path != "triton")

    monkeypatch.setattr(train_step, "measure", measure)
    assert (
        train_step.main(["--steps", "3", "--modes", "eager", "--dtypes", "float32", "--json", str(tmp_path / "t.json")])
        == 1
    )
    assert "4/3 WRONG" in capsys.readouterr().out


def test_a_row_that_fails_is_recorded_and_the_others_still_run(tmp_path, capsys, monkeypatch):
    _as_if_on_a_gpu(monkeypatch, liger=False)

    def measure(path, *args):
        if path == "native":
            raise RuntimeError("compile failed\nlong traceback")
        return fake_row(path, *args)

    monkeypatch.setattr(train_step, "measure", measure)
    out = tmp_path / "t.json"
    assert train_step.main(["--modes", "compile", "--dtypes", "float32", "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["error"] for r in rows] == [None, "RuntimeError: compile failed", None]
    assert "long traceback" in rows[1]["traceback"] and "traceback" not in rows[0]
    assert "float32 compile native: RuntimeError: compile failed" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# Which kernels are the norm's


@pytest.mark.parametrize(
    "name, verdict",
    [
        # the Triton path's own kernels, also under a suffix that torch.compile may add
        ("_rmsnorm_fwd_kernel", "own"),
        ("_rmsnorm_bwd_looped_kernel", "own"),
        ("_dgamma_column_sum_kernel", "own"),
        ("_dgamma_column_sum_kernel_0", "own"),
        # Liger's
        ("_rms_norm_forward_kernel", "own"),
        ("_block_rms_norm_backward_kernel", "own"),
        # aten's fused RMSNorm (layer-norm kernels with an rms flag)
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, true>(int, float)", "own"),
        ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float, true>()", "own"),
        ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>(long)", "own"),
        ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float, float>(long, float)", "own"),
        # Inductor's generated kernels holding the norm, with whatever it fused
        ("triton_per_fused_add_mean_mul_pow_rsqrt_silu_0", "fused"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_silu_0", "fused"),
        ("triton_per_fused_add_div_expand_mul_pow_silu_backward_sum_1", "fused"),
        ("triton_poi_fused__fused_rms_norm_backward_3", "fused"),
        ("triton_per_fused__fused_rms_norm__fused_rms_norm_backward_silu_silu_backward_3", "fused"),
        # the rest of the step
        ("triton_per_fused_mse_loss_1", None),
        ("triton_poi_fused_mse_loss_backward_0", None),
        ("triton_red_fused_sum_2", None),  # a Linear's bias gradient, a column sum like dgamma's
        ("triton_poi_fused_addmm_mse_loss_mse_loss_backward_3", None),
        ("triton_poi_fused_as_strided_clone_4", None),
        ("triton_poi_fused_silu_silu_backward_4", None),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off", None),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
            None,
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda, std::array<char*, 2>>",
            None,
        ),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", None),
        ("void at::native::elementwise_kernel<128, 2, at::native::pow_tensor_scalar_kernel_impl<float, float>>", None),
    ],
)
def test_the_norm_kernels_are_found_by_name(name, verdict):
    assert train_step.norm_kernel(name, OWN) == verdict


def test_the_triton_paths_kernels_are_read_from_kernels_py():
    assert "_rmsnorm_fwd_kernel" in OWN and "_dgamma_column_sum_kernel" in OWN
    assert all(k.endswith("_kernel") for k in OWN)


def test_only_the_gpus_activity_is_kept_from_a_profile_not_its_annotations():
    from types import SimpleNamespace

    from torch.profiler import DeviceType

    def event(name, device, us, annotation=False):
        span = SimpleNamespace(elapsed_us=lambda: us)
        return SimpleNamespace(name=name, device_type=device, time_range=span, is_user_annotation=annotation)

    events = [
        event("aten::mm", DeviceType.CPU, 50.0),
        event("sm90_gemm", DeviceType.CUDA, 30.0),
        event("Optimizer.step#Adam.step", DeviceType.CUDA, 99.0, annotation=True),
        event("Memset (Device)", DeviceType.CUDA, 1.0),
    ]
    assert train_step.device_activity(events) == [("sm90_gemm", 30.0), ("Memset (Device)", 1.0)]


def test_a_profile_is_summed_per_step_with_copies_apart():
    events = [
        ("sm90_gemm", 300.0),
        ("_rmsnorm_fwd_kernel", 100.0),
        ("triton_per_fused_add_div_mul_pow_sum_1", 50.0),
        ("Memcpy DtoD (Device -> Device)", 40.0),
        ("sm90_gemm", 300.0),
        ("Memset (Device)", 1.0),
    ] * 2
    s = train_step.summarize(events, 2, OWN)
    assert s["gpu_ms"] == pytest.approx(0.75) and s["kernels_per_step"] == 4 and s["copies_per_step"] == 2
    assert s["norm_gpu_ms"] == pytest.approx(0.15) and s["norm_fused"]
    assert [k["name"] for k in s["kernels"]][0] == "sm90_gemm" and s["kernels"][0]["per_step"] == 2


def test_a_profile_without_a_named_norm_kernel_gives_no_norm_time():
    s = train_step.summarize([("sm90_gemm", 10.0), ("void at::native::reduce_kernel<MeanOps>", 5.0)], 1, OWN)
    assert s["norm_gpu_ms"] is None and not s["norm_fused"] and s["gpu_ms"] == pytest.approx(0.015)


# --------------------------------------------------------------------------------------------------
# The Markdown table


def results(rows):
    return dict(
        kind="train_step",
        device="NVIDIA H200",
        torch="2.11.0",
        triton="3.6.0",
        liger_kernel=None,
        python="3.12.3",
        sizes=dict(input_dim=64, hidden_dim=4096, output_dim=16, lr=1e-3, batch_size=16384),
        steps=100,
        profile_steps=5,
        rows=rows,
    )


def test_the_markdown_table_has_a_row_per_result_and_only_the_footnotes_it_uses():
    text = train_step.markdown(
        results(
            [
                fake_row("reference", "eager", "float32", None, 100, 10, OWN, norm_ms=None),
                fake_row("triton", "reduce-overhead", "bfloat16", None, 100, 10, OWN, norm_ms=0.25),
            ]
        )
    )
    lines = text.splitlines()
    assert "Linear(64, 4096)" in lines[0] and "16384 rows" in lines[0] and "NVIDIA H200, torch 2.11.0" in lines[0]
    assert "Liger" not in lines[0] and "median of 100 steps" in lines[0]
    rows = markdown_rows(text)
    assert lines[2].startswith("| path ") and lines[3].startswith("|---")  # a Markdown table after the sentence
    assert rows[0][:4] == ["path", "mode", "dtype", "wall ms/step"]
    assert rows[1] == ["reference", "eager", "float32", "7.250", "1.500", "6.500", "21", "–", "0/0"]
    assert rows[2] == ["triton", "reduce-overhead", "bfloat16", "7.250", "1.500", "6.500", "21", "0.250", "100/100"]
    assert any(line.startswith("–: ") for line in lines) and not any(line.startswith("*: ") for line in lines)


def test_the_markdown_table_marks_fused_norm_times_and_failed_rows():
    rows = [
        fake_row("native", "compile", "float32", None, 100, 10, OWN, norm_ms=1.5, fused=True),
        dict(path="liger", mode="compile", dtype="float32", error="RuntimeError: boom", calls_ok=False),
    ]
    text = train_step.markdown(results(rows))
    lines = text.splitlines()
    assert markdown_rows(text)[1:] == [
        ["native", "compile", "float32", "7.250", "1.500", "6.500", "21", "1.500*", "0/0"],
        ["liger", "compile", "float32", "RuntimeError: boom", "", "", "", "", ""],
    ]
    assert any(line.startswith("*: ") for line in lines) and not any(line.startswith("–: ") for line in lines)


def test_table_prints_a_results_file_as_markdown_without_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train_step.torch.cuda, "is_available", lambda: pytest.fail("--table needs no GPU"))
    data = results([fake_row("triton", "eager", "float32", None, 100, 10, OWN)])
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert train_step.main(["--table", str(tmp_path / "t.json")]) == 0
    assert capsys.readouterr().out == train_step.markdown(data) + "\n"


@pytest.mark.parametrize(
    "content, says",
    [(None, "cannot be read"), ("{not json", "not JSON"), ('{"kind": "sweep"}', "not a train_step result")],
)
def test_table_refuses_a_file_that_is_no_result_in_one_line(content, says, tmp_path, capsys):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    assert train_step.main(["--table", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"train_step: --table {path}: {says}"), err


# --------------------------------------------------------------------------------------------------
# The network and its step


PRESET_TEXT = """# @package _global_
model:
  input_dim: 3
  hidden_dim: 5
  output_dim: 2
  lr: 2.0e-2
data:
  batch_size: 11
  train_size: 99
"""


@pytest.mark.parametrize("omegaconf", [True, False], ids=["omegaconf", "yaml"])
def test_the_sizes_are_read_from_the_preset(omegaconf, tmp_path, monkeypatch):
    if not omegaconf:
        monkeypatch.setitem(sys.modules, "omegaconf", None)  # as where the training extra is not installed
    path = tmp_path / "large.yaml"
    path.write_text(PRESET_TEXT)
    assert train_step.load_sizes(path) == dict(input_dim=3, hidden_dim=5, output_dim=2, lr=0.02, batch_size=11)


def test_the_preset_is_the_large_model():
    assert train_step.PRESET == ROOT / "conf" / "model" / "large.yaml"
    assert set(train_step.load_sizes()) == {"input_dim", "hidden_dim", "output_dim", "lr", "batch_size"}


def test_every_path_trains_the_same_network_and_only_triton_counts_calls(device):
    """Eager steps (CUDA graphs need a GPU): same seed, same initial weights, same losses on every path to
    float32 reordering; the Triton path's kernels count one forward and one backward per step."""
    from rmsnorm_kernel import call_counts

    losses = {}
    for path in ("reference", "native", "triton"):
        step = train_step.make_step(path, "eager", torch.float32, SMALL, device)
        before = call_counts()
        losses[path] = [float(step().detach()) for _ in range(3)]
        want = {"forward": 3, "backward": 3} if path == "triton" else {"forward": 0, "backward": 0}
        assert train_step.count_delta(before, call_counts()) == want
        assert train_step.expected_calls(path, 3) == want
    assert losses["triton"] == pytest.approx(losses["reference"], rel=1e-5)
    assert losses["native"] == pytest.approx(losses["reference"], rel=1e-5)
    assert losses["triton"][2] < losses["triton"][0]  # Adam steps lower the loss on a fixed batch


def _measure_here(monkeypatch, device, path, make_step=None):
    """``measure`` of one small eager row on this machine, with a made-up profile."""
    monkeypatch.setattr(train_step.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(train_step, "profile_kernels", lambda step, n: [("_rmsnorm_fwd_kernel", 10.0)] * n)
    if make_step is not None:
        monkeypatch.setattr(train_step, "make_step", make_step)
    monkeypatch.setattr(train_step, "load_sizes", lambda *a: pytest.fail("measure reads the sizes it is given"))
    return train_step.measure(path, "eager", "float32", SMALL, 3, 2, OWN, device)


@pytest.mark.parametrize("path", ["triton", "reference"])
def test_a_row_counts_the_triton_calls_of_its_timed_steps(path, device, monkeypatch):
    row = _measure_here(monkeypatch, device, path)
    k = 3 if path == "triton" else 0
    assert row["calls"] == {"forward": k, "backward": k} and row["calls_ok"]
    assert row["norm_gpu_ms"] == pytest.approx(0.01) and row["kernels_per_step"] == 1 and row["error"] is None
    assert row["last_loss"] < row["first_loss"]


def test_a_row_whose_steps_run_the_norm_twice_fails_its_count(device, monkeypatch):
    real = train_step.make_step

    def twice(*args):
        step = real(*args)
        return lambda: (step(), step())[1]

    row = _measure_here(monkeypatch, device, "triton", make_step=twice)
    assert row["calls"] == {"forward": 6, "backward": 6} and not row["calls_ok"]


def test_a_bfloat16_step_runs_the_whole_network_and_batch_in_bfloat16(device, monkeypatch):
    seen = []
    real_mse = train_step.F.mse_loss
    monkeypatch.setattr(train_step.F, "mse_loss", lambda y, t: seen.append((y.dtype, t.dtype)) or real_mse(y, t))
    step = train_step.make_step("triton", "eager", torch.bfloat16, SMALL, device)
    assert step().dtype == torch.bfloat16 and seen == [(torch.bfloat16, torch.bfloat16)]


def test_its_default_results_file_is_one_clean_removes(tmp_path):
    from rmsnorm_kernel.checks import generated

    assert generated.is_generated_file(tmp_path, train_step.DEFAULT_JSON.as_posix())
    assert generated.is_generated_file(tmp_path, train_step.DEFAULT_JSON.as_posix() + ".prev3")  # an earlier run's
