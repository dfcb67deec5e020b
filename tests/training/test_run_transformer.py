"""``model=transformer`` through ``run()``: the language model on every path, its checks, resume and DDP.

A tiny decoder (one block, dim 32, windows of 16 bytes, 4 windows a step) so that the Triton path through
Triton's interpreter takes seconds; the preset's own sizes are run by the slow tier.
"""

import math

import pytest
import torch

from rmsnorm_kernel.ops.tolerances import TRAINING_CURVE_RTOL, compare
from rmsnorm_kernel.training.checkpoints import CheckpointError, read_checkpoint
from rmsnorm_kernel.training.config import ConfigError
from rmsnorm_kernel.training.events import read_scalars
from tests.helpers import CPU_ONLY, DEVICE, needs_a_working_interpreter, train_process

from .helpers import DDP, FSDP2, SCHEDULE, checkpoint_of, needs_two_processes, train

TINY_LM = [
    "model=transformer",
    "model.dim=32",
    "model.heads=2",
    "model.layers=1",
    "model.mlp_hidden=64",
    "model.seq_len=16",
    "data.batch_size=4",
    "data.train_size=64",
    "data.val_size=8",
    "data.test_size=8",
]
STEPS = 4  # helpers.SCHEDULE's
#: One block without q/k norm: its two norms and the final one. With q/k norm, two more.
NORM_CALLS, QK_NORM_CALLS = 3, 5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = {}
    for impl in ("reference", "native", "triton"):
        root = tmp_path_factory.mktemp(f"lm_{impl}")
        out[impl] = (root, train(root, f"norm={impl}", *TINY_LM))
    return out


def test_every_path_trains_the_language_model_and_passes_its_checks(paths):
    for impl, (_, result) in paths.items():
        assert result.ok, (impl, result.failures)
        assert result.loss_name == "loss" and result.steps == STEPS
        assert result.metrics["reload/max_abs_diff"] == 0.0
        assert result.metrics["test/ppl"] == pytest.approx(math.exp(result.metrics["test/loss"]))
        # each compared path names the norm layer whose weight gradient came closest to the tolerance
        for path in ("triton", "native"):
            assert result.norm_worst_layers[path] in {"blocks.0.attn_norm", "blocks.0.mlp_norm", "final_norm"}
            tag = "parity/norm_worst_over_tol" if path == "triton" else "parity/native_norm_worst_over_tol"
            assert 0.0 <= result.metrics[tag] <= 1.0


def test_each_run_logs_its_tokens_per_second_and_charts_every_tag_it_logs(paths):
    import re

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    for impl, (_, result) in paths.items():
        tokens_per_step = 4 * 16  # data.batch_size windows of model.seq_len bytes
        assert result.metrics["time/tokens_per_s"] == pytest.approx(tokens_per_step / (result.step_ms / 1e3))
        scalars = read_scalars(result.log_dir)
        assert [s for s, _ in scalars["time/tokens_per_s"]] == [s for s, _ in scalars["time/step_ms"]]
        if DEVICE == "cuda":  # every norm layer's GPU time in each window, a part of the step's
            norms, steps = scalars["time/rmsnorm_ms"], scalars["time/step_ms"]
            assert [s for s, _ in norms] == [s for s, _ in steps]
            assert all(0 < norm < whole for (_, norm), (_, whole) in zip(norms, steps))
        else:
            assert "time/rmsnorm_ms" not in scalars  # no GPU, no GPU time
        acc = EventAccumulator(result.log_dir)
        acc.Reload()
        (event,) = acc.Tensors("custom_scalars__config__")
        (category,) = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0]).category
        charts = {c.title: list(c.multiline.tag) for c in category.chart}
        assert list(charts)[:4] == ["train/loss", "val/loss", "val/ppl", next(t for t in charts if "tokens_per_s" in t)]
        for title, patterns in charts.items():
            if title.startswith("time/step_ms") and DEVICE != "cuda":
                patterns = patterns[:1]  # time/rmsnorm_ms: the layers' GPU time, on a GPU only
            for pattern in patterns:
                assert any(re.match(pattern, tag) for tag in scalars), (impl, title, pattern)


def test_the_triton_path_runs_once_per_norm_call_and_the_others_never(paths):
    assert paths["triton"][1].calls["train/forward"] == STEPS * NORM_CALLS
    assert paths["triton"][1].calls["train/backward"] == STEPS * NORM_CALLS
    for impl in ("reference", "native"):
        assert paths[impl][1].calls["train/forward"] == paths[impl][1].calls["train/backward"] == 0


def test_the_paths_loss_curves_agree_within_the_declared_tolerance(paths):
    curves = {impl: read_scalars(result.log_dir) for impl, (_, result) in paths.items()}
    reference = curves["reference"]
    for impl in ("native", "triton"):
        for tag in ("train/loss", "val/loss", "val/ppl"):
            assert [s for s, _ in curves[impl][tag]] == [s for s, _ in reference[tag]], (impl, tag)
            for (_, a), (_, b) in zip(curves[impl][tag], reference[tag]):
                assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL), (impl, tag, a, b)


def test_every_norm_layer_has_the_same_weights_on_every_path_at_the_end(paths):
    final = {impl: read_checkpoint(checkpoint_of(root, impl))["state_dict"] for impl, (root, _) in paths.items()}
    norms = [k for k in final["reference"] if k.endswith("norm.weight")]
    assert len(norms) == NORM_CALLS
    for impl in ("native", "triton"):
        for key in norms:
            assert compare(final[impl][key], final["reference"][key]).ok, (impl, key)


def test_q_and_k_norms_add_two_triton_calls_per_block(tmp_path):
    result = train(tmp_path, "norm=triton", *TINY_LM, "model.qk_norm=true", "trainer.max_steps=2")
    assert result.ok, result.failures
    assert result.calls["train/forward"] == result.calls["train/backward"] == 2 * QK_NORM_CALLS


def test_the_loss_falls_below_a_uniform_guess_over_bytes(tmp_path):
    """ln(256) is the loss of a model that has learned nothing; the bytes of source code are far from
    uniform, and twenty steps learn that."""
    result = train(
        tmp_path, "norm=reference", *TINY_LM, "trainer.max_steps=20", "trainer.val_check_interval=20", "model.lr=1e-2"
    )
    assert result.ok, result.failures
    assert result.metrics["val/loss"] < math.log(256) - 1.0


def test_a_language_model_run_extended_from_its_checkpoint_continues_bit_for_bit(tmp_path, paths):
    """Trained to step 2, then extended to step 4 from its last checkpoint (a branch: a new version folder),
    it logs the losses and ends with the weights of a run trained to step 4 at once. On the reference path:
    resuming does not depend on the norm's path (the Triton path's resumes: test_resume.py, and the FSDP2
    one below)."""
    straight = paths["reference"][1]
    first = train(tmp_path, "norm=reference", *TINY_LM, "trainer.max_steps=2")
    assert first.ok and first.steps == 2
    resumed = train(tmp_path, "norm=reference", *TINY_LM, "ckpt_path=last")
    assert resumed.ok, resumed.failures
    assert resumed.steps == STEPS and resumed.branched_from.endswith(" at step 2")
    losses = read_scalars(first.log_dir)["train/loss"] + read_scalars(resumed.log_dir)["train/loss"]
    assert losses == read_scalars(straight.log_dir)["train/loss"]
    ends = [read_checkpoint(r.checkpoint)["state_dict"] for r in (straight, resumed)]
    assert all(ends[0][k].equal(ends[1][k]) for k in ends[0])


@pytest.mark.parametrize("impl", ["reference", "native", "triton"])
def test_the_large_preset_trains_in_bfloat16_on_every_path_at_a_reduced_size(tmp_path, impl):
    # the preset itself is for a GPU; here its schedule and precision with the tiny decoder's sizes
    result = train(tmp_path, f"norm={impl}", "model=transformer_large", "trainer.precision=bf16-true", *TINY_LM[1:])
    assert result.ok, result.failures
    final = read_checkpoint(result.checkpoint)["state_dict"]
    assert {t.dtype for t in final.values()} == {torch.bfloat16}


@pytest.mark.slow
@needs_a_working_interpreter
def test_the_three_path_command_on_the_preset_passes_its_checks_and_its_cpu_curves_agree(tmp_path):
    """``train.py model=transformer -m norm=reference,native,triton`` as documented: the preset's own sizes
    and the default schedule of 100 steps, in float32 on the CPU (no GPU visible, on any machine), where
    the paths' loss curves are held to ``TRAINING_CURVE_RTOL``. On a GPU the paths' float32 curves drift
    further apart, PyTorch's own ``F.rms_norm`` included: measured and reported in docs/training.md."""
    proc = train_process(tmp_path, "model=transformer", "-m", "norm=reference,native,triton", env=CPU_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = "seed0_transformer_dim64_layers2_heads4_mlp128_seq64_qknormFalse"
    for impl in ("reference", "native", "triton"):
        assert f"run {impl}_{name}: OK" in proc.stdout
    impls = ("reference", "native", "triton")
    curves = {impl: read_scalars(next((tmp_path / "runs" / f"{impl}_{name}").glob("version_*"))) for impl in impls}
    for impl in ("native", "triton"):
        for (_, a), (_, b) in zip(curves[impl]["train/loss"], curves["reference"]["train/loss"], strict=True):
            assert math.isclose(a, b, rel_tol=TRAINING_CURVE_RTOL)
    assert curves["reference"]["val/loss"][-1][1] < math.log(256) - 1.0


@pytest.mark.slow
@needs_two_processes
@pytest.mark.parametrize("strategy", [DDP, FSDP2], ids=["ddp", "fsdp2"])
def test_two_processes_train_the_language_model_like_one_at_the_same_global_batch(tmp_path, strategy):
    (tmp_path / "two").mkdir()
    two = train_process(tmp_path / "two", "norm=triton", *SCHEDULE, *TINY_LM, *strategy, "data.batch_size=2")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "reload parity: max |diff| 0.0 (bit-identical)" in two.stdout
    single = train(tmp_path / "single", "norm=triton", *TINY_LM)
    assert single.ok, single.failures
    a = read_checkpoint(checkpoint_of(tmp_path / "two", "triton"))["state_dict"]
    b = read_checkpoint(checkpoint_of(tmp_path / "single", "triton"))["state_dict"]
    assert a.keys() == b.keys()  # whole tensors in one file, under the network's own names (FSDP2 too)
    for key, tensor in b.items():
        assert compare(a[key], tensor).ok, key


@pytest.mark.slow
@needs_two_processes
def test_an_fsdp2_run_extended_from_its_checkpoint_ends_with_the_weights_of_one_run_through(tmp_path):
    args = ("norm=triton", *SCHEDULE, *TINY_LM, *FSDP2, "data.batch_size=2")
    for folder, extra in (("straight", ()), ("resumed", ("trainer.max_steps=2",)), ("resumed", ("ckpt_path=last",))):
        (tmp_path / folder).mkdir(exist_ok=True)
        proc = train_process(tmp_path / folder, *args, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
    straight = read_checkpoint(checkpoint_of(tmp_path / "straight", "triton"))
    (path,) = (tmp_path / "resumed" / "checkpoints").glob("triton_seed*/version_1/final.ckpt")  # the branch
    resumed = read_checkpoint(path)
    assert resumed["global_step"] == straight["global_step"] == STEPS
    assert all(straight["state_dict"][k].equal(v) for k, v in resumed["state_dict"].items())


def test_a_window_longer_than_a_split_of_the_text_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^model.seq_len is 200000; accepted: fewer than the \d+ bytes of the "):
        train(tmp_path, "norm=reference", *TINY_LM, "model.seq_len=200000")
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_a_checkpoint_of_the_regression_is_refused_naming_the_kind_of_network(tmp_path):
    regression = train(tmp_path / "mlp", "norm=reference")
    with pytest.raises(CheckpointError, match=r"was trained with model.kind = 'mlp'; the configuration asks for 'tr"):
        train(tmp_path / "lm", "norm=reference", *TINY_LM, f"ckpt_path={regression.checkpoint}")
