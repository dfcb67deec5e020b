"""clean --scope generated: removes what the project's commands generate, and nothing else."""

from pathlib import Path

import pytest

from rmsnorm_kernel.verify import clean

from .helpers import GENERATED, KEPT, make_project


def test_dry_run_lists_the_generated_directories_and_removes_nothing(tmp_path):
    root = make_project(tmp_path / "proj")
    removals = clean.clean_generated(root, dry_run=True)
    listed = {Path(r.path).relative_to(root.resolve()).as_posix() for r in removals if r.action == "would remove"}
    assert listed == GENERATED
    assert all((root / p).exists() for p in GENERATED | KEPT)


def test_clean_removes_exactly_the_generated_directories_and_follows_no_link(tmp_path):
    root = make_project(tmp_path / "proj")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    (root / "outputs").rename(root / "outputs_real")
    (root / "outputs").symlink_to(outside, target_is_directory=True)
    removals = clean.clean_generated(root, dry_run=False)
    assert not any((root / p).exists() for p in GENERATED - {"outputs"})
    assert all((root / p).exists() for p in KEPT)
    assert (outside / "keep.txt").read_text() == "precious"  # a linked outputs/ is not followed
    assert any(r.action.startswith("skipped: symbolic link") for r in removals)


@pytest.mark.parametrize("pyproject", [None, "other_project"])
def test_clean_refuses_outside_this_project(tmp_path, pyproject):
    root = make_project(tmp_path / "proj", name=pyproject or "x")
    if pyproject is None:
        (root / "pyproject.toml").unlink()
    with pytest.raises(clean.NotTheProject, match="accepted: the root of the rmsnorm_kernel project"):
        clean.clean_generated(root, dry_run=False)
    assert all((root / p).exists() for p in GENERATED)
