"""The Hydra configuration through Hydra's compose API: groups, overrides, typed and range errors."""

import os
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from rmsnorm_kernel.ops.contract import MAX_N
from rmsnorm_kernel.ops.impls import IMPLS
from rmsnorm_kernel.training import config
from rmsnorm_kernel.training.config import STRATEGIES, ConfigError, check_path, check_processes, validate
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
    assert (cfg.model.hidden_dim, cfg.data.batch_size) == (4096, 262144)
    assert cfg.data.train_size >= 8 * cfg.data.batch_size and cfg.data.val_size == cfg.data.test_size == 262144
    validate(cfg)
    reduced = compose_cfg(["model=large", "model.hidden_dim=96", "data.batch_size=16"])
    assert (reduced.model.hidden_dim, reduced.data.batch_size, reduced.model.input_dim) == (96, 16, 64)
    # the preset changes nothing else: the default model's other values stay
    assert compose_cfg(["model=large"]).trainer == compose_cfg().trainer


@pytest.mark.parametrize("impl", IMPLS)
def test_the_norm_group_has_an_option_for_each_path_that_selects_it(impl):
    cfg = compose_cfg([f"norm={impl}"])
    assert (cfg.norm.impl, cfg.norm.eps, cfg.norm.fallback) == (impl, 1e-6, None)
    validate(cfg)


def test_command_line_overrides_reach_the_config():
    cfg = compose_cfg(["seed=3", "trainer.max_steps=200", "data.batch_size=64", "paths.runs=elsewhere"])
    assert (cfg.seed, cfg.trainer.max_steps, cfg.data.batch_size, cfg.paths.runs) == (3, 200, 64, "elsewhere")


def test_unknown_norm_choice_lists_the_available_ones():
    listed = r"\s+".join(sorted(IMPLS))  # Hydra lists the group's options sorted, one a line
    with pytest.raises(ConfigCompositionException, match=rf"(?s)Could not find 'norm/cuda'.*{listed}"):
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
        ("model.lr=0", r"model.lr is 0.0; accepted: a finite number > 0 that float32 holds"),
        ("norm.eps=-1e-6", r"norm.eps is -1e-06; accepted: a finite number > 0 that float32 holds"),
        ("data.noise=-0.1", r"data.noise is -0.1; accepted: a finite number >= 0 that float32 holds"),
        ("norm.fallback=triton", r"norm.fallback is 'triton'; accepted: null or reference"),
        ("norm.impl=cuda", r"norm.impl is 'cuda'; accepted: triton, reference, native"),
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


def test_the_transformer_preset_sets_a_decoder_on_text_and_leaves_the_regression_keys_null():
    cfg = compose_cfg(["model=transformer"])
    assert cfg.model.kind == "transformer" and cfg.model.qk_norm is False
    assert (cfg.model.input_dim, cfg.model.hidden_dim, cfg.model.output_dim, cfg.data.noise) == (None,) * 4
    validate(cfg)
    assert compose_cfg(["model=transformer"]).trainer == compose_cfg().trainer


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.kind=cnn"], r"model.kind is 'cnn'; accepted: mlp, transformer"),
        (["model.dim=64"], r"model.dim is 64, a setting of model.kind transformer; accepted: null with model.kind mlp"),
        (
            ["model.kind=transformer"],
            r"model.input_dim is 64, a setting of model.kind mlp; accepted: null with model.kind transformer",
        ),
        (["model=transformer", "model.layers=null"], r"model.layers is null; accepted: a value, which model.kind"),
        (["model=transformer", "model.layers=0"], r"model.layers is 0; accepted: an integer >= 1"),
        (["model=transformer", "model.dim=30"], r"model.dim is 30 with model.heads 4; accepted: a dim that the heads"),
        (["model=transformer", "model.dim=36"], r"model.dim is 36 with model.heads 4"),  # heads of 9: odd
        (["model=transformer", "data.noise=0.1"], r"data.noise is 0.1; accepted: null with model.kind transformer"),
        (["data.noise=null"], r"data.noise is None; accepted: a number >= 0 with model.kind mlp"),
    ],
)
def test_a_network_setting_its_kind_does_not_take_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(overrides))


@pytest.fixture(scope="module")
def base_cfg():
    return compose_cfg()


def refusal(cfg, **values):
    """The one line ``validate`` refuses ``cfg`` with, after setting ``values`` ("data.seed": -1)."""
    from omegaconf import OmegaConf

    cfg = cfg.copy()
    for key, value in values.items():
        OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    line = str(info.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("key", ["seed", "data.seed"])
@pytest.mark.parametrize("value", [-1, 2**32, 2**70])
def test_seeds_outside_numpys_range_are_refused(base_cfg, key, value):
    assert (
        refusal(base_cfg, **{key: value}) == f"{key} is {value}; accepted: an integer from 0 to 4294967295 (2**32 - 1)"
    )


@pytest.mark.parametrize("key", ["seed", "data.seed"])
def test_seeds_at_the_ends_of_the_range_are_accepted(base_cfg, key):
    from omegaconf import OmegaConf

    for value in (0, 2**32 - 1):
        cfg = base_cfg.copy()
        OmegaConf.update(cfg, key, value)
        validate(cfg)


@pytest.mark.parametrize("key", ["norm.eps", "model.lr"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", 0.0, 1e-50, 1e-39, 1e39])
def test_positive_floats_must_be_finite_and_held_by_float32(base_cfg, key, value):
    value = float(value)
    assert refusal(base_cfg, **{key: value}) == (
        f"{key} is {value}; accepted: a finite number > 0 that float32 holds (1.1754944e-38 to 3.4028235e+38)"
    )


@pytest.mark.parametrize("value", [1.2e-38, 1e-6, 0.5, 3.4e38])
def test_eps_inside_float32s_normal_range_is_accepted(base_cfg, value):
    from omegaconf import OmegaConf

    cfg = base_cfg.copy()
    OmegaConf.update(cfg, "norm.eps", value)
    OmegaConf.update(cfg, "model.lr", value)
    validate(cfg)


@pytest.mark.parametrize("value", ["nan", "inf", 1e39])
def test_noise_must_be_finite_in_float32(base_cfg, value):
    line = refusal(base_cfg, **{"data.noise": float(value)})
    assert line.startswith(f"data.noise is {float(value)}; accepted: a finite number >= 0 that float32 holds (0 or ")


def ddp(cfg, devices=2, nodes=1, **values):
    return {"trainer.strategy": "ddp", "trainer.devices": devices, "trainer.num_nodes": nodes, **values}


@pytest.mark.parametrize("key", ["data.val_size", "data.test_size"])
def test_each_process_needs_a_row_of_every_evaluation_split(base_cfg, key):
    assert refusal(base_cfg, **ddp(base_cfg, **{key: 1})) == (
        f"{key} is 1, fewer rows than the 2 processes (trainer.devices 2 x trainer.num_nodes 1); "
        "accepted: an integer >= 2"
    )
    line = refusal(base_cfg, **ddp(base_cfg, devices="2", nodes=3, **{key: 5}))
    assert line.startswith(f"{key} is 5, fewer rows than the 6 processes (trainer.devices 2 x trainer.num_nodes 3)")
    # under the strategy's automatic choice, 2 devices are 2 processes too
    assert refusal(base_cfg, **{"trainer.devices": 2, key: 1}).startswith(f"{key} is 1, fewer rows than the 2")


def test_the_global_batch_must_fit_in_the_training_split(base_cfg):
    assert refusal(base_cfg, **ddp(base_cfg, **{"data.batch_size": 1025})) == (
        "data.batch_size is 1025 x 2 processes = 2050, larger than data.train_size 2048; accepted: a batch size "
        "<= 1024 (the training split over the processes)"
    )
    check_processes(base_cfg, 64)  # 32 x 64 = 2048 rows: exactly one global batch
    with pytest.raises(ConfigError, match="data.batch_size is 32 x 65 processes = 2080"):
        check_processes(base_cfg, 65)


def test_splits_of_one_row_are_enough_for_one_process(base_cfg):
    from omegaconf import OmegaConf

    cfg = base_cfg.copy()
    OmegaConf.update(cfg, "data.val_size", 1)
    OmegaConf.update(cfg, "data.test_size", 1)
    validate(cfg)


@pytest.mark.parametrize("devices", [0, -2, "two", "", True])
def test_device_counts_lightning_refuses_are_refused(base_cfg, devices):
    line = refusal(base_cfg, **{"trainer.devices": devices})
    assert line.startswith(f"trainer.devices is {devices!r}; accepted: an integer >= 1, -1 or auto")


def test_unknown_accelerators_and_strategies_are_refused(base_cfg):
    assert refusal(base_cfg, **{"trainer.accelerator": "tpuu"}).startswith(
        "trainer.accelerator is 'tpuu'; accepted: auto, cpu, gpu, cuda, mps"
    )
    assert refusal(base_cfg, **{"trainer.strategy": "fsdp"}).startswith(
        "trainer.strategy is 'fsdp'; accepted: auto, single_device, fsdp2 or a ddp strategy"
    )
    assert refusal(base_cfg, **{"trainer.strategy": "fsdp2", "compile": True}) == (
        "compile is true with trainer.strategy fsdp2; accepted: compile=false under fsdp2, or compile=true "
        "with a ddp strategy"
    )
    assert refusal(base_cfg, **{"trainer.strategy": "single_device", "trainer.devices": 2}).startswith(
        "trainer.strategy is 'single_device' with 2 processes"
    )


@pytest.mark.slow  # imports Lightning: seconds on its own
def test_the_accepted_strategies_are_lightnings():
    from lightning.pytorch.strategies import StrategyRegistry

    # fsdp2: Lightning's ModelParallelStrategy, which has no name in the registry (training/trainer.py)
    assert set(STRATEGIES) - {"auto", "fsdp2"} <= set(StrategyRegistry.available_strategies())


@pytest.mark.parametrize("key", ["paths.runs", "paths.checkpoints"])
def test_a_folder_name_longer_than_the_file_system_allows_is_refused(base_cfg, tmp_path, key):
    line = refusal(base_cfg, **{key: str(tmp_path / "n" / ("x" * 256))})
    assert line == (
        f"{key} has a folder name of 256 bytes ({'x' * 24}...); accepted: names of at most "
        f"{os.pathconf(tmp_path, 'PC_NAME_MAX')} bytes (the file system's limit)"
    )
    assert not (tmp_path / "n").exists()  # nothing written


def test_names_are_measured_in_bytes(tmp_path):
    check_path("paths.runs", tmp_path / ("x" * 255))
    with pytest.raises(ConfigError, match="paths.runs has a folder name of 256 bytes"):
        check_path("paths.runs", tmp_path / ("é" * 128))  # 128 characters, 256 bytes


@pytest.mark.parametrize("key", ["paths.runs", "paths.checkpoints"])
def test_a_path_longer_than_the_file_system_allows_is_refused(base_cfg, tmp_path, key):
    path = tmp_path / "/".join(["d" * 200] * 21)
    line = refusal(base_cfg, **{key: str(path)})
    size, most = len(os.fsencode(str(path))), os.pathconf(tmp_path, "PC_PATH_MAX") - 255
    assert size > most
    assert line == (
        f"{key} is a path of {size} bytes ({str(path)[:32]}...); accepted: at most {most} bytes "
        f"(the file system's {most + 255} less 255 for the run's folders and files)"
    )
    fits = tmp_path / "/".join(["d" * 200] * ((most - len(os.fsencode(str(tmp_path)))) // 201))
    check_path(key, fits)  # at most the limit: accepted
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_importing_the_config_imports_neither_triton_nor_lightning():
    # A fresh interpreter: in this one, other tests have imported both already.
    code = "import sys, rmsnorm_kernel.training.config; print(sorted({'triton', 'lightning'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_decoder_too_wide_for_any_memory_is_a_configuration_error_not_an_allocation_failure():
    """model.dim=70000: about 39 billion parameters, 16 bytes each to train, more than any one GPU or machine
    holds. (A width past the Triton contract's MAX_N alone is no configuration error: the reference path and
    norm.fallback=reference run it, and the Triton path stops with the contract's message.)"""
    with pytest.raises(ConfigError, match=r"dim 70000, .* GiB a process; accepted: sizes whose training state fits"):
        validate(compose_cfg(["model=transformer", "model.dim=70000"]))
    validate(compose_cfg([f"model.hidden_dim={MAX_N + 1}"]))


#: A decoder of dim 4096 (2 blocks, SwiGLU of 128): 2 * (4 * 4096**2 + 3 * 4096 * 128 + 2 * 4096) + 257 * 4096
#: parameters (qkv, out, the MLP, two norms a block; the embedding and the final norm).
WIDE_DECODER = ["model=transformer", "model.dim=4096"]
WIDE_DECODER_PARAMETERS = 2 * (4 * 4096**2 + 3 * 4096 * 128 + 2 * 4096) + 257 * 4096


def test_model_sizes_whose_training_state_cannot_fit_in_memory_are_refused_in_one_line(base_cfg, monkeypatch):
    """16 bytes a float32 parameter (weight, gradient, Adam's two moments) against the memory a process
    trains in, here 1.5 GiB: 2.06 GiB in float32 is refused, 1.03 GiB in bfloat16 or a half under fsdp2 is not."""
    monkeypatch.setattr(config, "memory_bytes", lambda on_gpu: 3 * 2**29)
    need = 16 * WIDE_DECODER_PARAMETERS / 2**30
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(WIDE_DECODER))
    line = str(info.value)
    assert "\n" not in line and line.startswith("model sizes dim 4096, layers 2, heads 4, mlp_hidden 128, seq_len 64 ")
    assert f"a network of {WIDE_DECODER_PARAMETERS:,} parameters" in line
    assert f"takes {need:,.1f} GiB a process; accepted: sizes whose training state fits in the " in line
    assert line.endswith("'s 1.5 GiB")
    validate(compose_cfg([*WIDE_DECODER, "trainer.precision=bf16-true"]))
    validate(compose_cfg([*WIDE_DECODER, "trainer.strategy=fsdp2", "trainer.accelerator=cpu", "trainer.devices=2"]))
    validate(base_cfg)


def test_a_network_too_large_for_any_machine_is_a_configuration_error_not_an_allocation():
    with pytest.raises(ConfigError, match=r"^model sizes input_dim 10000000, hidden_dim 65536, output_dim 16 make"):
        validate(compose_cfg(["model.input_dim=10000000", f"model.hidden_dim={MAX_N}"]))
