"""A run's configuration on TensorBoard's HPARAMS page, laid out for comparing runs: the RMSNorm path
(``norm.impl``) and the settings the command line set (the keys a multirun sweeps) first, and each value
as what it is (booleans as booleans, strings as strings, with discrete domains).

TensorBoard orders the page's columns by whether a setting ``differs`` between the runs, then by name, and
shows the first five at first: this run's experiment marks the path and the command line's keys as the
ones that differ, and lists them first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams.summary_v2 import Discrete, hparams_pb

from .events import run_event_writer
from .paths import NAME_DEFAULTS

if TYPE_CHECKING:
    from lightning.pytorch.loggers import TensorBoardLogger

#: The setting the runs are compared by: the RMSNorm path.
PATH = "norm.impl"


def flat_hparams(cfg: DictConfig) -> dict:
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop(NAME_DEFAULTS, None)  # the reference of the run's name, not a setting
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value)
            else:
                flat[name] = value if isinstance(value, (int, float, str, bool)) else str(value)

    walk("", container)
    return flat


def hparam_metrics(loss_name: str) -> tuple[str, ...]:
    """The HPARAMS tab's metrics: scalars every run logs (TensorBoard reads their values from the run's
    scalars): the losses of the three splits (``mse`` or ``loss``, ``network.LOSS_NAMES``) and the run's time."""
    return (f"train/{loss_name}", f"val/{loss_name}", f"test/{loss_name}", "time/run_s")


def compared(params: dict, overridden: list[str]) -> list[str]:
    """The settings the runs are compared by, in order: the path, then those of ``params`` the command line
    set (an override of a group, ``norm=triton``, sets every key under it)."""
    keys = [PATH] if PATH in params else []
    for override in overridden:
        key = override.split("=", 1)[0].lstrip("+~")
        keys += [k for k in params if (k == key or k.startswith(f"{key}.")) and k not in keys]
    return keys


def _info(name: str, value, differs: bool) -> api_pb2.HParamInfo:
    info = api_pb2.HParamInfo(name=name, differs=differs)
    if isinstance(value, bool):
        Discrete([False, True]).update_hparam_info(info)
    elif isinstance(value, str):
        Discrete([value]).update_hparam_info(info)
    else:
        info.type = api_pb2.DATA_TYPE_FLOAT64
    return info


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])


def hparams_summaries(params: dict, loss_name: str, overridden: list[str] = ()) -> list[Summary]:
    """The experiment (each setting's type, domain and place, ``compared`` first; the metrics), the
    session's start (the values, typed) and its end."""
    first = compared(params, list(overridden))
    order = first + [k for k in params if k not in first]
    experiment = api_pb2.Experiment(
        hparam_infos=[_info(k, params[k], k in first) for k in order],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m)) for m in hparam_metrics(loss_name)],
    )
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)
    return [
        _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
        hparams_pb({k: params[k] for k in order}),
        _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)),
    ]


def write_hparams(logger: TensorBoardLogger, params: dict, loss_name: str, overridden: list[str] = ()) -> None:
    """The run's configuration in TensorBoard's HPARAMS tab, with ``hparam_metrics`` as its metrics."""
    with run_event_writer(logger) as writer:
        for summary in hparams_summaries(params, loss_name, overridden):
            writer.add_summary(summary)
