"""The Hydra configuration through Hydra's compose API: groups, overrides, typed and range errors."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from rmsnorm_kernel.config import ConfigError, validate

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def compose_cfg(overrides=()):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_defaults_are_the_documented_schedule_on_the_triton_path():
    cfg = compose_cfg()
    assert cfg.norm.impl == "triton"
    assert (cfg.trainer.max_steps, cfg.data.batch_size, cfg.model.hidden_dim) == (100, 32, 257)
    assert (cfg.paths.runs, cfg.paths.checkpoints, cfg.seed) == ("runs", "checkpoints", 0)
    validate(cfg)


def test_norm_group_selects_the_reference_path():
    assert compose_cfg(["norm=reference"]).norm.impl == "reference"


def test_command_line_overrides_reach_the_config():
    cfg = compose_cfg(["seed=3", "trainer.max_steps=200", "data.batch_size=64", "paths.runs=elsewhere"])
    assert (cfg.seed, cfg.trainer.max_steps, cfg.data.batch_size, cfg.paths.runs) == (3, 200, 64, "elsewhere")


def test_unknown_norm_choice_lists_the_available_ones():
    with pytest.raises(ConfigCompositionException, match=r"(?s)Could not find 'norm/cuda'.*reference.*triton"):
        compose_cfg(["norm=cuda"])


def test_non_integer_max_steps_fails_on_the_typed_schema_naming_the_key():
    with pytest.raises(ConfigCompositionException, match="trainer.max_steps=lots") as info:
        compose_cfg(["trainer.max_steps=lots"])
    cause = info.value.__cause__
    assert isinstance(cause, ValidationError)
    assert "could not be converted to Integer" in str(cause)
    assert "full_key: trainer.max_steps" in str(cause)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigCompositionException, match="trainer.max_step"):
        compose_cfg(["trainer.max_step=10"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.max_steps=-5", r"trainer.max_steps is -5; accepted: an integer >= 1"),
        ("trainer.max_steps=0", r"trainer.max_steps is 0"),
        ("data.batch_size=-1", r"data.batch_size is -1; accepted: an integer >= 1"),
        ("data.batch_size=4096", r"data.batch_size is 4096, larger than data.train_size"),
        ("model.lr=0", r"model.lr is 0.0; accepted: a number > 0"),
        ("trainer.precision=fp8", r"trainer.precision is 'fp8'"),
    ],
)
def test_out_of_range_values_are_refused_by_validate(override, message):
    cfg = compose_cfg([override])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)

