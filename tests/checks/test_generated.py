"""The names of the files the commands write (``checks.generated``) agree with the code that writes them."""

import os
from pathlib import Path

from rmsnorm_kernel.checks import figures, generated
from rmsnorm_kernel.checks.main import build_parser


def test_the_report_names_are_the_commands_and_the_figure_names_the_figures():
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(generated.REPORT_COMMANDS) == set(sub.choices)
    assert set(generated.FIGURE_FILES) == set(figures.FIGURES)


def test_the_checkpoint_temporary_is_named_as_the_training_names_it(tmp_path, monkeypatch):
    from rmsnorm_kernel.training import checkpoints

    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(
        checkpoints.os, "replace", lambda src, dst: (renamed.append(Path(src).name), real_replace(src, dst))
    )
    checkpoints.atomic_torch_save({"x": 1}, tmp_path / "last.ckpt")
    (temporary,) = renamed
    assert generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/{temporary}")
    assert not generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/{temporary}")  # not in a version folder


def test_the_lock_and_probe_files_are_named_as_the_training_names_them(tmp_path):
    from rmsnorm_kernel.training.checkpoints import LOCK_NAME
    from rmsnorm_kernel.training.paths import PROBE_PREFIX

    assert generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/{LOCK_NAME}")
    assert not generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/{LOCK_NAME}")  # not in a version folder
    for top in ("runs", "checkpoints"):
        assert generated.is_generated_file(tmp_path, f"{top}/{PROBE_PREFIX}{os.getpid()}")
    assert not generated.is_generated_file(tmp_path, f"outputs/{PROBE_PREFIX}1")


def test_the_record_of_a_runs_end_is_named_as_the_training_names_it(tmp_path):
    from rmsnorm_kernel.training.resume import END_RECORD, record_end

    assert generated.END_RECORD == END_RECORD
    folder = tmp_path / "checkpoints/triton_seed0/version_0"
    folder.mkdir(parents=True)
    record_end(folder, 4, [])
    assert [p.name for p in folder.iterdir()] == [END_RECORD]
    assert generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/{END_RECORD}")
    assert generated.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/.{END_RECORD}.123.tmp")
    assert not generated.is_generated_file(
        tmp_path, f"checkpoints/triton_seed0/{END_RECORD}"
    )  # not in a version folder
