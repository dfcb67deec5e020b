"""The Hydra configuration through Hydra's compose API: groups, overrides, typed and range errors."""

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from rmsnorm_kernel.training.config import ConfigError, validate
from tests.helpers import compose_cfg


def test_defaults_are_the_documented_schedule_on_the_triton_path():
    cfg = compose_cfg()
    assert cfg.norm.impl == "triton"
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval, cfg.checkpoint.every_n_steps) == (100, 25, 50)
    assert (cfg.data.batch_size, cfg.model.input_dim, cfg.model.hidden_dim, cfg.model.output_dim) == (32, 64, 257, 16)
    assert (cfg.paths.runs, cfg.paths.checkpoints, cfg.seed, cfg.ckpt_path) == ("runs", "checkpoints", 0, None)
    validate(cfg)


def test_parity_timing_and_nodes_defaults():
    cfg = compose_cfg()
    assert (cfg.parity.every_n_steps, cfg.trainer.log_every_n_steps, cfg.trainer.num_nodes) == (25, 10, 1)


def test_the_large_model_preset_sets_thousands_of_features_and_rows_and_yields_to_the_command_line():
    cfg = compose_cfg(["model=large"])
    assert (cfg.model.hidden_dim, cfg.data.batch_size) == (4096, 16384)
    assert cfg.data.train_size >= 8 * cfg.data.batch_size and cfg.data.val_size == cfg.data.test_size == 16384
    validate(cfg)
    reduced = compose_cfg(["model=large", "model.hidden_dim=96", "data.batch_size=16"])
    assert (reduced.model.hidden_dim, reduced.data.batch_size, reduced.model.input_dim) == (96, 16, 64)
    # the preset changes nothing else: the default model's other values stay
    assert compose_cfg(["model=large"]).trainer == compose_cfg().trainer


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
        ("norm.eps=-1e-6", r"norm.eps is -1e-06; accepted: a number > 0"),
        ("data.noise=-0.1", r"data.noise is -0.1; accepted: a number >= 0"),
        ("norm.fallback=triton", r"norm.fallback is 'triton'; accepted: null or reference"),
        ("trainer.precision=fp8", r"trainer.precision is 'fp8'"),
        (
            "parity.every_n_steps=-1",
            r"parity.every_n_steps is -1; accepted: an integer >= 0 \(0: only the initial check\)",
        ),
        ("trainer.log_every_n_steps=0", r"trainer.log_every_n_steps is 0; accepted: an integer >= 1"),
        ("trainer.num_nodes=0", r"trainer.num_nodes is 0; accepted: an integer >= 1"),
    ],
)
def test_out_of_range_values_are_refused_by_validate(override, message):
    cfg = compose_cfg([override])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.slow
def test_importing_the_config_imports_neither_triton_nor_lightning():
    # A fresh interpreter: in this one, other tests have imported both already.
    code = "import sys, rmsnorm_kernel.training.config; print(sorted({'triton', 'lightning'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
