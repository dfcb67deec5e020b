"""clean --scope generated: removes the files the project's commands wrote, one by one, and keeps
every other file, listed as kept."""

import json
import os
import re
from pathlib import Path

import pytest

from rmsnorm_kernel.checks import clean, generated

from .helpers import run_cli

# --------------------------------------------------------------------------------------------------
# A project tree: files of every kind the commands write, and the user's own files among them

#: Written by the project's commands (or by Lightning, Hydra, pytest, Python on their behalf).
GENERATED_FILES = [
    ".pytest_cache/CACHEDIR.TAG",
    ".pytest_cache/README.md",
    ".pytest_cache/v/cache/lastfailed",
    "__pycache__/train.cpython-311.pyc",
    "checkpoints/.write-probe.4194305",
    "checkpoints/native_seed0/version_0/final.ckpt",
    "checkpoints/native_seed0/version_0/last.ckpt",
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
    "outputs/benchmark-sweep.run.jsonl",
    "outputs/benchmark-sweep.run.after7.jsonl",
    "outputs/benchmark-sweep.run.jsonl.prev1",
    "outputs/.benchmark-sweep.md.4242.tmp",
    "outputs/.check-forward.json.4242.tmp",
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
    "runs/.write-probe.4194305",
    "runs/summary_2026-01-02_03-04-07.json",
    "runs/summary_2026-01-02_03-04-07.md",
    "runs/native_seed0/version_0/events.out.tfevents.1796078881.vm.13719.0",
    "runs/native_seed0/version_0/hparams.yaml",
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
    "outputs/.notes.txt.4242.tmp",  # the temporary of a file the project does not write
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
    "checkpoints/native_seed0/",
    "checkpoints/native_seed0/version_0/",
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
    "runs/native_seed0/",
    "runs/native_seed0/version_0/",
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


#: The cleaned files of a tree that are the project's caches, cleaned only at the project's root.
CACHE_FILES = [p for p in GENERATED_FILES if p.startswith(".pytest_cache/") or "__pycache__/" in p]
CACHE_FOLDERS = [p for p in REMOVED_FOLDERS if p.startswith(".pytest_cache/") or "__pycache__/" in p]


@pytest.mark.parametrize("pyproject", [None, "other_project"])
def test_outside_the_projects_root_the_generated_folders_are_cleaned_and_the_caches_kept(tmp_path, pyproject):
    """The commands write relative to where they are started: clean cleans that folder's outputs/, runs/,
    checkpoints/ and multirun/ wherever it is, and the caches only at the project's root."""
    root = make_tree(tmp_path / "proj", name=pyproject or "x")
    if pyproject is None:
        (root / "pyproject.toml").unlink()
    before = snapshot(root)
    removed = {r.path for r in clean.clean_generated(root, dry_run=False) if r.action == "removed"}
    assert removed == set(GENERATED_FILES + REMOVED_FOLDERS) - set(CACHE_FILES + CACHE_FOLDERS)
    after = snapshot(root)
    assert all(after[rel] == before[rel] for rel in CACHE_FILES + USER_FILES + UNTOUCHED_FILES[1:])


def test_a_project_folder_that_is_not_a_folder_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(clean.CleanRefused, match="accepted: the folder the commands were started in"):
            clean.clean_generated(where, dry_run=True)
    assert (tmp_path / "file").read_text() == "x"


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


def test_the_command_cleans_the_folder_it_is_started_in_wherever_it_is(tmp_path, capsys, monkeypatch):
    stranger = tmp_path / "stranger"
    (stranger / "outputs").mkdir(parents=True)
    (stranger / "outputs" / "check-forward.json").write_text("{}")
    (stranger / "outputs" / "mine.txt").write_text("mine")
    (stranger / "src" / "__pycache__").mkdir(parents=True)
    (stranger / "src" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    monkeypatch.chdir(stranger)
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated")
    assert rc == 0 and "not the project's root: its caches are not cleaned" in out
    assert _table(out) == {"outputs/check-forward.json": "removed", "outputs/mine.txt": clean.KEPT_USER}
    assert not (stranger / "outputs" / "check-forward.json").exists()
    assert (stranger / "src" / "__pycache__" / "m.cpython-311.pyc").exists()
    # --project names the folder from anywhere
    (stranger / "runs").mkdir()
    (stranger / "runs" / "summary_x.md").write_text("s")
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(capsys, "clean", "--scope", "generated", "--project", stranger)
    assert rc == 0 and _table(out)["runs/summary_x.md"] == "removed"


@pytest.mark.parametrize("problem", ["outputs_is_a_file", "outputs_unwritable", "project_is_a_file", "no_project"])
def test_every_argument_is_checked_before_anything_is_removed(project, tmp_path, capsys, monkeypatch, problem):
    monkeypatch.chdir(project)
    (tmp_path / "a_file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    argv = {
        "outputs_is_a_file": ["--outputs", tmp_path / "a_file"],
        "outputs_unwritable": ["--outputs", locked / "reports"],
        "project_is_a_file": ["--project", tmp_path / "a_file"],
        "no_project": ["--project", tmp_path / "missing"],
    }[problem]
    if problem == "outputs_unwritable" and os.access(locked, os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    before = snapshot(project)
    rc, out, err = run_cli(capsys, "clean", "--scope", "generated", *argv)
    locked.chmod(0o700)
    assert (rc, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and err.startswith("rmsnorm-kernel clean: --"), err
    assert "accepted" in err
    assert snapshot(project) == before


# --------------------------------------------------------------------------------------------------
# A run in use: its lock is held by a live process

#: A process id above Linux's largest (pid_max is at most 2**22): no process has it.
DEAD_PID = 2**22 + 1
LIVE_RUN = ["checkpoints/triton_seed0/version_0/", "runs/triton_seed0/version_0/"]


def _under(paths, folders):
    return sorted(p for p in paths if any(p.startswith(f) for f in folders))


@pytest.fixture
def held_lock(project):
    from rmsnorm_kernel.training.checkpoints import RunLock

    lock = RunLock(project / "checkpoints/triton_seed0/version_0")
    lock.acquire()  # as train.py does: this process is the live run
    yield lock
    lock.release()


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_run_whose_lock_is_held_is_kept_whole_and_listed_with_its_process(project, held_lock, dry_run):
    before = snapshot(project)
    entries = clean.clean_generated(project, dry_run=dry_run)
    actions = {r.path: r.action for r in entries}
    for folder in LIVE_RUN:
        assert actions[folder].startswith(f"kept: in use by live process {os.getpid()} "), actions[folder]
        assert "checkpoints/triton_seed0/version_0/.run.lock" in actions[folder]
    assert _under(actions, LIVE_RUN) == sorted(LIVE_RUN)  # the folders listed, nothing inside them
    after = snapshot(project)
    for rel, data in before.items():
        if any(rel.startswith(f) for f in LIVE_RUN):
            assert after[rel] == data, rel  # the run's files, its lock included, are as they were
    # everything else is cleaned as before
    assert {p for p, a in actions.items() if a in ("removed", "would remove")} == set(
        GENERATED_FILES + REMOVED_FOLDERS
    ) - set(_under(GENERATED_FILES, LIVE_RUN))


def test_a_held_lock_whose_file_names_a_dead_process_still_keeps_the_run(project, held_lock):
    """The flock decides, as for train.py: the id in the file is only the message."""
    held_lock.path.write_text(f"{DEAD_PID}\n")
    actions = {r.path: r.action for r in clean.clean_generated(project, dry_run=False)}
    assert actions["checkpoints/triton_seed0/version_0/"].startswith(f"kept: in use by live process {DEAD_PID} ")
    assert (project / "checkpoints/triton_seed0/version_0/last.ckpt").exists()


def test_a_stale_lock_of_a_killed_run_is_removed_with_the_run(project):
    """A lock file whose process is dead holds no lock (the operating system released it): the run ended."""
    lock = project / "checkpoints/triton_seed0/version_0/.run.lock"
    lock.write_text(f"{DEAD_PID}\n")
    actions = {r.path: r.action for r in clean.clean_generated(project, dry_run=False)}
    assert actions["checkpoints/triton_seed0/version_0/.run.lock"] == "removed"
    assert actions["checkpoints/triton_seed0/version_0/last.ckpt"] == "removed"
    assert not lock.exists()


def test_a_run_that_takes_its_lock_after_the_plan_is_kept(project, monkeypatch):
    from rmsnorm_kernel.training.checkpoints import RunLock

    real_plan = clean.plan

    def plan_then_start_a_run(root):
        planned = real_plan(root)  # made while no run held the lock
        RunLock(root / "checkpoints/triton_seed0/version_0").acquire()
        return planned

    monkeypatch.setattr(clean, "plan", plan_then_start_a_run)
    actions = {r.path: r.action for r in clean.clean_generated(project, dry_run=False)}
    assert actions["checkpoints/triton_seed0/version_0/last.ckpt"].startswith("kept: in use by live process")
    assert actions["runs/triton_seed0/version_0/hparams.yaml"].startswith("kept: in use by live process")
    assert (project / "checkpoints/triton_seed0/version_0/last.ckpt").exists()


def test_folders_and_probes_named_for_a_live_process_are_kept(project):
    pid = os.getpid()
    job = project / f"outputs/hydra/2026-01-02_03-04-05-123456_{pid}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "hydra.yaml").write_text("x")
    (job / "train.log").write_text("x")
    (project / f"runs/.write-probe.{pid}").write_text("")
    actions = {r.path: r.action for r in clean.clean_generated(project, dry_run=False)}
    assert actions[job.relative_to(project).as_posix() + "/"].startswith(f"kept: in use by live process {pid} ")
    assert actions[f"runs/.write-probe.{pid}"].startswith(f"kept: in use by live process {pid} ")
    assert (job / "train.log").exists()


def test_the_command_says_in_its_summary_that_a_live_run_was_kept(project, held_lock, capsys, monkeypatch):
    monkeypatch.chdir(project)
    for extra in (["--dry-run"], []):
        rc, out, _ = run_cli(capsys, "clean", "--scope", "generated", *extra)
        assert rc == 0
        assert "2 of them in use by a live process (a running training run) and left whole" in out, out
        assert _table(out)["checkpoints/triton_seed0/version_0/"].startswith("kept: in use by live process")
    assert (project / "checkpoints/triton_seed0/version_0/.run.lock").exists()


def test_the_lock_is_named_as_the_training_names_it():
    from rmsnorm_kernel.training.checkpoints import LOCK_NAME

    assert clean.LOCK_NAME == LOCK_NAME


def test_the_traceback_train_py_writes_after_a_crash_is_recognised_in_its_hydra_job_folder(tmp_path):
    from rmsnorm_kernel.training.cli import TRACEBACK_NAME

    assert generated.TRACEBACK_NAME == TRACEBACK_NAME
    for job in ("outputs/hydra/2026-01-02_03-04-05_4194305", "outputs/hydra/multirun/2026-01-02_03-04-06_4194306/0"):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra/hydra.yaml").write_text("hydra: {}\n")
        (tmp_path / job / "traceback.txt").write_text("Traceback (most recent call last):\n")
    (tmp_path / "outputs/hydra/not_a_job").mkdir(parents=True)
    (tmp_path / "outputs/hydra/not_a_job/traceback.txt").write_text("mine\n")
    done = {r.path: r.action for r in clean.clean_generated(tmp_path, dry_run=False)}
    assert done["outputs/hydra/2026-01-02_03-04-05_4194305/traceback.txt"] == clean.REMOVED
    assert done["outputs/hydra/multirun/2026-01-02_03-04-06_4194306/0/traceback.txt"] == clean.REMOVED
    assert done["outputs/hydra/not_a_job/traceback.txt"] == clean.KEPT_USER  # no Hydra job folder around it
    assert not (tmp_path / "outputs/hydra/2026-01-02_03-04-05_4194305").exists()
