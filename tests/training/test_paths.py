"""Where a run's files go: version folders claimed once, and run names from the configuration alone."""

import os

import pytest
from omegaconf import OmegaConf

from rmsnorm_kernel.training import config, paths  # noqa: F401  (config registers the schema)
from rmsnorm_kernel.training.paths import claim_version, run_name
from tests.helpers import compose_cfg


def test_a_new_version_is_claimed_once_even_when_another_run_took_it_first(tmp_path):
    """Two runs started at once list the same folders; the checkpoint folder's mkdir decides."""
    runs, ckpt = tmp_path / "runs" / "triton_seed0", tmp_path / "ckpt" / "triton_seed0"
    (runs / "version_0").mkdir(parents=True)
    assert claim_version(runs, ckpt) == 1  # past what TensorBoard already holds
    assert claim_version(runs, ckpt) == 2  # version_1 is now taken by the first claim
    (ckpt / "version_3").mkdir()  # made by another process in between
    assert claim_version(runs, ckpt) == 4


def test_run_names_come_from_the_composed_configuration_wherever_the_package_is_installed(tmp_path, monkeypatch):
    configs = {o: compose_cfg([*o]) for o in [(), ("model.hidden_dim=128",), ("norm=reference", "data.noise=0.1")]}
    # installed elsewhere (site-packages, no conf/ beside it), started elsewhere, no YAML file readable
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "site-packages/rmsnorm_kernel/training/paths.py"))
    monkeypatch.chdir(tmp_path)

    def no_file(*args, **kwargs):
        raise FileNotFoundError(os.fspath(args[0]) if args else "conf")

    monkeypatch.setattr(OmegaConf, "load", no_file)
    names = [run_name(cfg) for cfg in configs.values()]
    assert names == ["triton_seed0", "triton_seed0_hidden128", "reference_seed0_noise0.1"]


@pytest.mark.parametrize("preset,name", [("model=large", "triton_seed0_hidden4096"), ("seed=3", "triton_seed3")])
def test_a_preset_is_named_by_the_values_it_changes(preset, name):
    assert run_name(compose_cfg([preset])) == name
