"""The HPARAMS page in this process: the summaries a run writes, read back from an event file as TensorBoard
reads them, put the path and the command line's settings first, and give booleans and strings as such."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from torch.utils.tensorboard import FileWriter

from rmsnorm_kernel.training.hparams import compared, flat_hparams, hparams_summaries
from tests.helpers import compose_cfg

#: A run's settings as ``flat_hparams`` gives them, in its (alphabetical) order: a boolean, strings, numbers.
PARAMS = {
    "backend": "interpreter",
    "checkpoint.every_n_steps": 50,
    "compile": False,
    "data.batch_size": 32,
    "norm.eps": 1e-6,
    "norm.impl": "native",
    "seed": 3,
}


def written(tmp_path, params=PARAMS, overridden=("seed=3",)):
    """The hparams plugin's experiment and session start, read back from the event file."""
    writer = FileWriter(str(tmp_path))
    for summary in hparams_summaries(params, "mse", overridden):
        writer.add_summary(summary)
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    return experiment, session


def test_the_path_then_the_command_lines_settings_come_first_and_are_marked_as_differing(tmp_path):
    experiment, _ = written(tmp_path, overridden=("seed=3", "data.batch_size=32"))
    names = [info.name for info in experiment.hparam_infos]
    assert names[:3] == ["norm.impl", "seed", "data.batch_size"]
    assert sorted(names) == sorted(PARAMS)
    assert [info.name for info in experiment.hparam_infos if info.differs] == names[:3]
    # TensorBoard orders the columns by differs, then by name, and shows five: these three among them
    first_five = sorted(experiment.hparam_infos, key=lambda info: (not info.differs, info.name))[:5]
    assert {"norm.impl", "seed", "data.batch_size"} <= {info.name for info in first_five}


def test_booleans_and_strings_are_logged_as_what_they_are_with_discrete_domains(tmp_path):
    experiment, session = written(tmp_path)
    infos = {info.name: info for info in experiment.hparam_infos}
    assert session.hparams["compile"].WhichOneof("kind") == "bool_value"
    assert session.hparams["compile"].bool_value is False
    assert session.hparams["norm.impl"].string_value == "native"
    assert session.hparams["seed"].number_value == 3
    assert infos["compile"].type == api_pb2.DATA_TYPE_BOOL
    assert [v.bool_value for v in infos["compile"].domain_discrete.values] == [False, True]
    assert infos["norm.impl"].type == api_pb2.DATA_TYPE_STRING
    assert [v.string_value for v in infos["norm.impl"].domain_discrete.values] == ["native"]
    assert infos["seed"].type == api_pb2.DATA_TYPE_FLOAT64 and not infos["seed"].HasField("domain_discrete")
    assert [m.name.tag for m in experiment.metric_infos] == ["train/mse", "val/mse", "test/mse", "time/run_s"]


def test_an_override_of_a_group_marks_every_setting_under_it():
    assert compared(PARAMS, ["norm=triton", "+seed=4"]) == ["norm.impl", "norm.eps", "seed"]
    assert compared(PARAMS, []) == ["norm.impl"]  # the path, whatever the command line


def test_hparams_record_the_settings_not_the_defaults_the_run_name_is_relative_to():

    params = flat_hparams(compose_cfg(["model.hidden_dim=128"]))
    assert params["model.hidden_dim"] == 128 and not [k for k in params if k.startswith("name_defaults")]
