"""Figures from training runs and check reports; missing inputs are reported, not fatal."""

import json

import pytest

from rmsnorm_kernel.checks import figures
from rmsnorm_kernel.checks.main import main
from rmsnorm_kernel.ops.impls import IMPLS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 12


def train_curve(step: int, seed: int) -> float:
    return 1.0 / (1 + step) + 0.05 * seed


def val_curve(step: int, seed: int) -> float:
    return 1.5 / (1 + step) + 0.05 * seed


@pytest.fixture
def runs_dir(tmp_path):
    """Two seeds of each path, laid out as the training's TensorBoardLogger writes them."""
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path / "runs"
    for impl in IMPLS:
        for seed in (0, 1):
            writer = SummaryWriter(str(root / f"{impl}_seed{seed}" / "version_0"))
            for step in range(STEPS):
                writer.add_scalar("train/mse", train_curve(step, seed), step)
                if step % 4 == 3:
                    writer.add_scalar("val/mse", val_curve(step, seed), step)
            writer.add_scalar("calls/forward", 1.0, 0)  # other tags are ignored
            writer.close()
        # and one run of the language model on each path, which logs train/loss and val/loss
        writer = SummaryWriter(str(root / f"{impl}_seed0_transformer_dim64" / "version_0"))
        for step in range(STEPS):
            writer.add_scalar("train/loss", 5 * train_curve(step, 0), step)
            if step % 4 == 3:
                writer.add_scalar("val/loss", 5 * val_curve(step, 0), step)
        writer.close()
    return root


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_event_files_are_read_back_per_run_and_tag(runs_dir):
    runs = figures.read_training_scalars(runs_dir)
    regression = {f"{impl}_seed{s}/version_0" for impl in IMPLS for s in (0, 1)}
    language = {f"{impl}_seed0_transformer_dim64/version_0" for impl in IMPLS}
    assert set(runs) == regression | language
    assert all(runs[label] == {} for label in language)  # no MSE there
    steps, values = runs["triton_seed1/version_0"]["train/mse"]
    assert steps == list(range(STEPS))
    assert values == pytest.approx([train_curve(s, 1) for s in range(STEPS)])
    steps, values = runs["reference_seed0/version_0"]["val/mse"]
    assert steps == [3, 7, 11]
    assert values == pytest.approx([val_curve(s, 0) for s in (3, 7, 11)])


@pytest.mark.parametrize(
    "label,path",
    [
        ("triton_seed0/version_0", "triton"),
        ("reference_seed3", "reference"),
        ("native_seed0_hidden128/version_2", "native"),
        ("seed0", None),
        ("alternative_seed0/version_0", None),  # a path's name inside a word is not that path
        ("native_vs_triton/version_0", None),  # two paths: none
    ],
)
def test_run_path_comes_from_the_directory_name(label, path):
    assert figures.run_path(label) == path


def test_each_path_has_its_line_style():
    assert set(figures.PATH_STYLES) == set(IMPLS)
    assert len({style for style, _, _ in figures.PATH_STYLES.values()}) == len(IMPLS)


def test_training_figure_draws_every_path_and_both_tags(runs_dir, tmp_path):
    result = figures.training_figure(runs_dir, tmp_path / "t.png")
    assert result.status == "written" and is_png(result.path)
    assert "no run of" not in result.detail
    for tag in ("train/mse", "val/mse"):
        for impl in IMPLS:
            assert f"{impl}_seed0/version_0 {tag}" in result.series


def test_the_language_models_figure_draws_its_losses_and_leaves_the_regression_out(runs_dir, tmp_path):
    result = figures.training_figure(runs_dir, tmp_path / "t.png", "training_loss.png")
    assert result.status == "written" and is_png(result.path)
    assert sorted(result.series) == sorted(
        f"{impl}_seed0_transformer_dim64/version_0 {tag}" for impl in IMPLS for tag in ("train/loss", "val/loss")
    )
    assert "triton_seed1/version_0: no train/loss or val/loss scalars" in result.detail
    steps, values = figures.read_training_scalars(runs_dir, ("train/loss",))[
        "native_seed0_transformer_dim64/version_0"
    ]["train/loss"]
    assert steps == list(range(STEPS)) and values == pytest.approx([5 * train_curve(s, 0) for s in range(STEPS)])


def test_training_figure_notes_a_missing_path(runs_dir, tmp_path):
    import shutil

    for seed in (0, 1):
        shutil.rmtree(runs_dir / f"native_seed{seed}")
    result = figures.training_figure(runs_dir, tmp_path / "t.png")
    assert result.status == "written"
    assert "no run of the native path" in result.detail and "no run of the triton path" not in result.detail


def test_training_figure_without_runs_is_skipped(tmp_path):
    assert figures.training_figure(tmp_path / "runs", tmp_path / "t.png").status == "skipped"
    (tmp_path / "runs").mkdir()
    result = figures.training_figure(tmp_path / "runs", tmp_path / "t.png")
    assert result.status == "skipped" and "no TensorBoard event files" in result.detail
    assert not (tmp_path / "t.png").exists()


def test_check_errors_figure_reads_the_reports_the_commands_write(tmp_path, capsys):
    assert main(["check-forward", "--quick", "--outputs", str(tmp_path)]) == 0
    assert main(["check-forward", "--quick", "--kernel", "block-mean", "--outputs", str(tmp_path / "mutant")]) == 1
    capsys.readouterr()
    reports = {
        "forward": tmp_path / "check-forward.json",
        "mutant": tmp_path / "mutant" / "check-forward.json",
        "dx": tmp_path / "absent.json",
    }
    result = figures.check_errors_figure(reports, tmp_path / "e.png")
    assert result.status == "written" and is_png(result.path)
    assert {"forward float32 max abs error", "mutant bfloat16 max rel error"} <= set(result.series)
    assert "dx: no" in result.detail


def test_check_errors_figure_draws_a_report_whose_failed_case_has_no_error_measured(tmp_path):
    case = {"dtype": "float32", "max_abs": 1e-7, "max_rel": 1e-6, "atol": 1e-5, "ok": True}
    failed = {**case, "max_abs": None, "max_rel": None, "ok": False}  # a case that raised: NaN, written null
    (tmp_path / "check-forward.json").write_text(json.dumps({"cases": [case, failed]}))
    result = figures.check_errors_figure({"forward": tmp_path / "check-forward.json"}, tmp_path / "e.png")
    assert result.status == "written" and is_png(result.path)


def test_check_errors_figure_with_a_corrupt_report_fails_without_raising(tmp_path):
    (tmp_path / "check-forward.json").write_text("{not json")
    result = figures.check_errors_figure({"forward": tmp_path / "check-forward.json"}, tmp_path / "e.png")
    assert result.status == "failed" and "is not a check report" in result.detail


def test_figures_command_with_every_input(tmp_path, runs_dir, capsys):
    outputs = tmp_path / "outputs"
    assert main(["check-gamma", "--quick", "--outputs", str(outputs)]) == 0
    rc = main(["figures", "--outputs", str(outputs), "--runs", str(runs_dir)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = json.loads((outputs / "figures.json").read_text())
    assert {f["name"]: f["status"] for f in rep["figures"]} == {name: "written" for name in figures.FIGURES}
    assert all(is_png(outputs / "figures" / name) for name in figures.FIGURES)
    # the measurements draw their own
    assert set(figures.FIGURES) == {"training_mse.png", "training_loss.png", "check_errors.png"}


def test_figures_command_with_no_inputs_reports_each_and_fails(tmp_path, capsys):
    rc = main(["figures", "--outputs", str(tmp_path / "outputs"), "--runs", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "no figure could be drawn" in out
    rep = json.loads((tmp_path / "outputs" / "figures.json").read_text())
    assert {f["status"] for f in rep["figures"]} == {"skipped"}


def test_figures_help_says_what_each_figure_shows(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["figures", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for name in figures.FIGURES:
        assert name in out
    assert "train/mse" in out and "atol" in out


def test_figures_takes_no_benchmark_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["figures", "--outputs", str(tmp_path), "--benchmark", str(tmp_path / "benchmark.json")])
    assert exc.value.code == 2 and "unrecognized arguments: --benchmark" in capsys.readouterr().err
