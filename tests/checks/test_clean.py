"""clean --scope generated: removes the files the project's commands wrote, one by one, and keeps
every other file, listed as kept."""

import json
import os
import re
from pathlib import Path

import pytest

from rmsnorm_kernel.checks import clean, figures
from rmsnorm_kernel.checks.cli import build_parser

from .helpers import run_cli

# --------------------------------------------------------------------------------------------------
# A project tree: files of every kind the commands write, and the user's own files among them

#: Written by the project's commands (or by Lightning, Hydra, pytest, Python on their behalf).
GENERATED_FILES = [
    ".pytest_cache/CACHEDIR.TAG",
    ".pytest_cache/README.md",
    ".pytest_cache/v/cache/lastfailed",
    "__pycache__/train.cpython-311.pyc",
    "checkpoints/.write-probe.4242",
    "checkpoints/reference_seed1/version_2/.run.lock",
    "checkpoints/reference_seed1/version_2/.step00100.ckpt.4242.tmp",
    "checkpoints/reference_seed1/version_2/hpc_ckpt_1.ckpt",
    "checkpoints/reference_seed1/version_2/step00100-v1.ckpt",
    "checkpoints/triton_seed0/version_0/.last.ckpt.4242.tmp",
    "checkpoints/triton_seed0/version_0/final.ckpt",
    "checkpoints/triton_seed0/version_0/last.ckpt",
    "checkpoints/triton_seed0/version_0/step00050.ckpt",
    "multirun/2026-01-02/03-04-05/0/.hydra/config.yaml",
    "multirun/2026-01-02/03-04-05/0/.hydra/hydra.yaml",
    "multirun/2026-01-02/03-04-05/0/.hydra/overrides.yaml",
    "multirun/2026-01-02/03-04-05/0/train.log",
    "multirun/2026-01-02/03-04-05/multirun.yaml",
    "outputs/benchmark.json",
    "outputs/benchmark-sweep.json",
    "outputs/benchmark-sweep.md",
    "outputs/benchmark-sweep.run.json",
    "outputs/benchmark-sweep.run.after7.json",
    "outputs/benchmark-sweep.run.after7.tmp",
    "outputs/benchmark-sweep.run.json.prev1",
    "outputs/benchmark-sweep.tmp",
    "outputs/check-forward.json",
    "outputs/compile-report.json",
    "outputs/compile-report/inductor_output_0.py",
    "outputs/compile-report/inductor_output_1.py",
    "outputs/figures/benchmark_sweep.png",
    "outputs/figures/check_errors.png",
    "outputs/figures/training_mse.png",
    "outputs/hydra/2026-01-02_03-04-05/.hydra/config.yaml",
    "outputs/hydra/2026-01-02_03-04-05/.hydra/hydra.yaml",
    "outputs/hydra/2026-01-02_03-04-05/.hydra/overrides.yaml",
    "outputs/hydra/2026-01-02_03-04-05/train.log",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/.hydra/config.yaml",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/.hydra/hydra.yaml",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/.hydra/overrides.yaml",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/train.log",
    "outputs/hydra/multirun/2026-01-02_03-04-06/multirun.yaml",
    "runs/.write-probe.4242",
    "runs/summary_2026-01-02_03-04-07.json",
    "runs/summary_2026-01-02_03-04-07.md",
    "runs/triton_seed0/version_0/events.out.tfevents.1796078879.vm.13718.0",
    "runs/triton_seed0/version_0/events.out.tfevents.1796078880.vm.13718.1",
    "runs/triton_seed0/version_0/hparams.yaml",
    "src/pkg/__pycache__/mod.cpython-311.pyc",
    "tests/__pycache__/test_x.cpython-311-pytest-8.3.4.pyc",
]
#: The user's files in the same folders: kept, and listed as kept.
USER_FILES = [
    "checkpoints/keep.pt",
    "checkpoints/triton_seed0/version_0/best_by_hand.ckpt",
    "multirun/README.md",
    "outputs/figures/my_plot.png",
    "outputs/hydra/2026-01-02_03-04-05/analysis.ipynb",  # in a Hydra job folder
    "outputs/hydra/not_a_job/train.log",  # a Hydra name, but no .hydra/hydra.yaml beside it
    "outputs/my_experiments/check-forward.json",  # a report's name, not where reports go
    "outputs/my_experiments/results.csv",
    "outputs/notes.txt",
    "outputs/benchmark-sweep.notes.md",  # near a sweep file's name, not one
    "outputs/benchmark-sweep.part1of2.json",  # not a name the sweep writes
    "runs/summary.txt",
    "runs/triton_seed0/events.out.tfevents.1",  # not in a version_<k> folder
    "runs/triton_seed0/version_0/my_notes.md",
    "src/pkg/__pycache__/notes.txt",
]
#: Outside the cleaned folders: never listed, never touched.
UNTOUCHED_FILES = [
    "pyproject.toml",
    "conf/config.yaml",
    "src/pkg/mod.py",
    ".venv/lib/__pycache__/x.cpython-311.pyc",
    "venv2/pyvenv.cfg",
    "venv2/lib/__pycache__/x.cpython-311.pyc",
    ".scratch/__pycache__/y.cpython-311.pyc",
]
#: Folders that hold only generated files, or are the layout's own and empty: removed once emptied.
REMOVED_FOLDERS = [
    ".pytest_cache/",
    ".pytest_cache/v/",
    ".pytest_cache/v/cache/",
    "__pycache__/",
    "checkpoints/orphan_seed0/",  # empty: a run folder made before a run failed
    "checkpoints/reference_seed1/",
    "checkpoints/reference_seed1/version_2/",
    "multirun/2026-01-02/",
    "multirun/2026-01-02/03-04-05/",
    "multirun/2026-01-02/03-04-05/0/",
    "multirun/2026-01-02/03-04-05/0/.hydra/",
    "outputs/compile-report/",
    "outputs/hydra/2026-01-02_03-04-05/.hydra/",
    "outputs/hydra/multirun/",
    "outputs/hydra/multirun/2026-01-02_03-04-06/",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/",
    "outputs/hydra/multirun/2026-01-02_03-04-06/0/.hydra/",
    "runs/reference_seed0/",  # held only an empty version folder
    "runs/reference_seed0/version_3/",  # empty: a run that wrote nothing
    "tests/__pycache__/",
]
EMPTY_USER_FOLDER = "outputs/empty_by_the_user/"


def content(rel: str) -> bytes:
    return f"contents of {rel}\n".encode()


def make_tree(root: Path, name: str = "rmsnorm_kernel") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    for rel in GENERATED_FILES + USER_FILES + UNTOUCHED_FILES[1:]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content(rel))
    (root / "runs/reference_seed0/version_3").mkdir(parents=True)
    (root / "checkpoints/orphan_seed0").mkdir(parents=True)
    (root / EMPTY_USER_FOLDER).mkdir(parents=True)
    return root


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder."""
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.fixture
def project(tmp_path) -> Path:
    return make_tree(tmp_path / "proj")


# --------------------------------------------------------------------------------------------------
# The plan, the dry run and the clean


def test_dry_run_lists_every_generated_and_every_kept_file_and_changes_nothing(project):
    before = snapshot(project)
    entries = clean.clean_generated(project, dry_run=True)
    actions = {r.path: r.action for r in entries}
    assert sorted(p for p, a in actions.items() if a == "would remove") == sorted(GENERATED_FILES + REMOVED_FOLDERS)
    assert sorted(p for p, a in actions.items() if a.startswith("kept")) == sorted(USER_FILES + [EMPTY_USER_FOLDER])
    assert all(actions[p] == "kept: not written by this project's commands" for p in USER_FILES)
    assert set(actions) == set(
        GENERATED_FILES + REMOVED_FOLDERS + USER_FILES + [EMPTY_USER_FOLDER]
    )  # nothing else listed
    assert snapshot(project) == before


def test_clean_removes_exactly_the_generated_files_and_the_folders_they_leave_empty(project):
    before = snapshot(project)
    entries = clean.clean_generated(project, dry_run=False)
    assert sorted(r.path for r in entries if r.action == "removed") == sorted(GENERATED_FILES + REMOVED_FOLDERS)
    after = snapshot(project)
    for rel in USER_FILES + UNTOUCHED_FILES:
        assert after[rel] == before[rel], rel  # byte-identical
    assert not any(rel in after for rel in GENERATED_FILES)
    assert not any(rel.rstrip("/") in after for rel in REMOVED_FOLDERS)
    assert (project / EMPTY_USER_FOLDER).is_dir()
    # exactly what was there, less what was listed as removed
    assert set(after) == set(before) - set(GENERATED_FILES) - {f.rstrip("/") for f in REMOVED_FOLDERS}
    # a second clean finds nothing more to remove
    assert [r for r in clean.clean_generated(project, dry_run=False) if not r.action.startswith("kept")] == []


def test_a_tree_of_generated_files_only_is_left_without_its_generated_folders(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "rmsnorm_kernel"\n')
    for rel in GENERATED_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content(rel))
    clean.clean_generated(root, dry_run=False)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "pyproject.toml",
        "src",
        "src/pkg",
        "tests",
    ]


def test_links_are_neither_followed_nor_removed(tmp_path):
    root = make_tree(tmp_path / "proj")
    outside = tmp_path / "elsewhere"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious.ckpt").write_text("precious")
    (outside / "sub" / "benchmark.json").write_text("precious too")
    (root / "checkpoints/triton_seed0/version_0/step00099.ckpt").symlink_to(outside / "precious.ckpt")
    (root / "outputs/linked").symlink_to(outside / "sub", target_is_directory=True)
    (root / "runs").rename(root / "runs_real")
    (root / "runs").symlink_to(root / "runs_real", target_is_directory=True)
    actions = {r.path: r.action for r in clean.clean_generated(root, dry_run=False)}
    assert actions["checkpoints/triton_seed0/version_0/step00099.ckpt"] == "kept: symbolic link, not followed"
    assert actions["outputs/linked"] == "kept: symbolic link, not followed"
    assert actions["runs"] == "kept: symbolic link, not followed"
    assert (outside / "precious.ckpt").read_text() == "precious"
    assert (outside / "sub" / "benchmark.json").read_text() == "precious too"
    assert (root / "runs_real/triton_seed0/version_0/hparams.yaml").exists()  # behind the link: not entered
    assert (root / "checkpoints/triton_seed0/version_0/step00099.ckpt").is_symlink()


@pytest.mark.parametrize("pyproject", [None, "other_project"])
def test_clean_refuses_outside_this_project(tmp_path, pyproject):
    root = make_tree(tmp_path / "proj", name=pyproject or "x")
    if pyproject is None:
        (root / "pyproject.toml").unlink()
    before = snapshot(root)
    with pytest.raises(clean.NotTheProject, match="accepted: the root of the rmsnorm_kernel project"):
        clean.clean_generated(root, dry_run=False)
    assert snapshot(root) == before


# --------------------------------------------------------------------------------------------------
# The command


def _table(out: str) -> dict[str, str]:
    """path -> action from the printed table."""
    return dict(m.groups() for m in re.finditer(r"^(\S+)\s{2,}((?:would remove|removed|kept: .+))$", out, re.M))


def test_the_dry_run_command_prints_every_path_and_writes_nothing(project, capsys, monkeypatch):
    monkeypatch.chdir(project)
    before = snapshot(project)
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated", "--dry-run")
    assert rc == 0
    table = _table(out)
    assert sorted(p for p, a in table.items() if a == "would remove") == sorted(GENERATED_FILES + REMOVED_FOLDERS)
    assert sorted(p for p, a in table.items() if a.startswith("kept")) == sorted(USER_FILES + [EMPTY_USER_FOLDER])
    assert (
        f"{len(GENERATED_FILES)} file(s) and {len(REMOVED_FOLDERS)} folder(s) would be removed; "
        f"{len(USER_FILES) + 1} path(s) kept" in out
    )
    assert snapshot(project) == before  # no report in outputs/, nothing else either


def test_the_report_goes_only_outside_the_cleaned_folders(project, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(project)
    before = snapshot(project)
    for inside in ("outputs", "outputs/reports", "runs", "src/pkg/__pycache__"):
        rc, _, err = run_cli(capsys, "clean", "--scope", "generated", "--dry-run", "--outputs", inside)
        assert rc == 2 and "which clean cleans" in err, (inside, err)
    assert snapshot(project) == before
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated", "--outputs", tmp_path / "reports")
    report = json.loads((tmp_path / "reports" / "clean.json").read_text())
    assert rc == 0 and report["ok"] and report["dry_run"] is False
    assert sorted(p["path"] for p in report["paths"] if p["action"] == "removed") == sorted(
        GENERATED_FILES + REMOVED_FOLDERS
    )
    assert (project / "outputs" / "notes.txt").read_bytes() == content("outputs/notes.txt")


def test_the_command_refuses_outside_the_project(tmp_path, capsys, monkeypatch):
    stranger = tmp_path / "stranger"
    (stranger / "outputs").mkdir(parents=True)
    (stranger / "outputs" / "check-forward.json").write_text("{}")
    monkeypatch.chdir(stranger)
    rc, _, err = run_cli(capsys, "clean", "--scope", "generated")
    assert rc == 2 and "no pyproject.toml" in err
    assert (stranger / "outputs" / "check-forward.json").read_text() == "{}"


# --------------------------------------------------------------------------------------------------
# The names agree with the code that writes the files


def test_the_report_names_are_the_commands_and_the_figure_names_the_figures():
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(clean.REPORT_COMMANDS) == set(sub.choices)
    assert set(clean.FIGURE_FILES) == set(figures.FIGURES)


def test_the_checkpoint_temporary_is_named_as_the_training_names_it(tmp_path, monkeypatch):
    from rmsnorm_kernel.training import checkpoints

    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(
        checkpoints.os, "replace", lambda src, dst: (renamed.append(Path(src).name), real_replace(src, dst))
    )
    checkpoints.atomic_torch_save({"x": 1}, tmp_path / "last.ckpt")
    (temporary,) = renamed
    assert clean.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/{temporary}")
    assert not clean.is_generated_file(tmp_path, f"checkpoints/triton_seed0/{temporary}")  # not in a version folder


def test_the_lock_and_probe_files_are_named_as_the_training_names_them(tmp_path):
    from rmsnorm_kernel.training.checkpoints import LOCK_NAME
    from rmsnorm_kernel.training.paths import PROBE_PREFIX

    assert clean.is_generated_file(tmp_path, f"checkpoints/triton_seed0/version_0/{LOCK_NAME}")
    assert not clean.is_generated_file(tmp_path, f"checkpoints/triton_seed0/{LOCK_NAME}")  # not in a version folder
    for top in ("runs", "checkpoints"):
        assert clean.is_generated_file(tmp_path, f"{top}/{PROBE_PREFIX}{os.getpid()}")
    assert not clean.is_generated_file(tmp_path, f"outputs/{PROBE_PREFIX}1")
