"""The files and folders the project's commands write, by their names: how ``clean`` knows its own files.

How the project knows its own files: by the exact names the code that writes them gives them. A
manifest kept by the commands is the alternative, and the weaker one here: most of these files are
written on the project's behalf by Lightning (event files, checkpoints), Hydra (run folders), pytest
(its cache) and Python (bytecode), which would each have to be followed to record them, and a run
killed before it records a file would leave that file unknown for ever. The names are fixed by the
code, hold for trees written by any earlier run, and are checked against the code by the tests.

Generated, relative to that folder (``<name>`` is any run name, ``<k>``, ``<n>`` numbers):

- ``outputs/<command>.json``: a check command's report (``report.write_report``), for the commands of
  ``REPORT_COMMANDS``;
- ``outputs/figures/<figure>.png`` for the figures of ``FIGURE_FILES`` (``figures.FIGURES``);
- the files of the benchmark and the step and residual-add measurements (``python -m benchmarks.<name>``,
  outside the package): ``outputs/benchmark.json`` and ``outputs/figures/benchmark.png``,
  ``outputs/{train_step,residual_add,transformer_step}.json``, each with an earlier run's file kept as
  ``.json.prev<n>`` (``BENCHMARK_FILES``);
- the files of the benchmark sweep (``python -m benchmarks.sweep``, outside the package): a run's
  ``outputs/benchmark-sweep.run.jsonl`` (``.run.after<n>.jsonl`` for a run with ``--skip-done``, appended
  to while it runs) and an earlier run's file kept as ``.jsonl.prev<n>``; the merge's
  ``outputs/benchmark-sweep.json`` and ``outputs/benchmark-sweep.md`` and
  ``outputs/figures/benchmark_sweep.png``, each with an earlier merge's kept as ``.prev<n>`` (``SWEEP_FILES``);
- ``outputs/compile-report/inductor_output_<n>.py`` (``compile_report.compile_report``);
- in a Hydra job folder under ``outputs/hydra/`` or ``multirun/`` (a folder whose ``.hydra/`` holds
  ``hydra.yaml``): ``.hydra/config.yaml``, ``.hydra/hydra.yaml``, ``.hydra/overrides.yaml`` and
  ``train.log``, and ``traceback.txt`` (``training.cli.TRACEBACK_NAME``: the traceback of a run that
  crashed); in a sweep folder there, ``multirun.yaml``;
- ``runs/<name>/version_<k>/events.out.tfevents.*`` and ``hparams.yaml`` (Lightning's
  ``TensorBoardLogger``); ``runs/summary_*.md`` and ``runs/summary_*.json``
  (``training.summary.MultirunSummary``);
- ``checkpoints/<name>/version_<k>/``: ``step<n>.ckpt``, ``last.ckpt`` (either with Lightning's
  ``-v<n>`` suffix when the name was taken), ``final.ckpt``, ``hpc_ckpt_<n>.ckpt`` (Lightning's SLURM
  requeue), ``.run.lock``
  (``training.checkpoints.RunLock``, left by a killed run) and ``end.json`` (the record of the run's end,
  ``training.resume.record_end``);
- ``.<file>.<pid>.tmp`` beside any of those files: its temporary while it is written
  (``atomic.temporary_path``), left by a write that was stopped;
- ``runs/.write-probe.<pid>`` and ``checkpoints/.write-probe.<pid>`` (``training.paths.prepare_folder``,
  left by a run killed between writing and removing it);
- every file under ``.pytest_cache/`` (pytest's cache folder);
- ``*.pyc`` directly in a ``__pycache__/`` of the project's Python trees (``PYTHON_TREES``, and the
  root's own ``__pycache__/``).
"""

from __future__ import annotations

import re
from pathlib import Path

PROJECT_NAME = "rmsnorm_kernel"
GENERATED_TOP_LEVEL = ("outputs", "runs", "checkpoints", "multirun", ".pytest_cache")
CACHE_DIR_NAME = "__pycache__"
#: The folders holding the project's Python files, searched for ``__pycache__`` (besides the root's own).
PYTHON_TREES = ("src", "tests", "benchmarks")
#: The commands that write ``<outputs>/<command>.json`` (the subcommands of ``checks.main``).
REPORT_COMMANDS = (
    "environment",
    "reference",
    "check-forward",
    "check-backward",
    "check-gamma",
    "check-residual",
    "negative",
    "exercise",
    "profile",
    "compile-report",
    "figures",
    "check-checkpoints",
    "clean",
)
#: The PNG files of the ``figures`` command (``figures.FIGURES``).
FIGURE_FILES = ("training_mse.png", "training_loss.png", "check_errors.png")
#: The benchmark's files, by the names ``benchmarks.benchmark`` gives them (a test checks they agree).
BENCHMARK_FILES = (
    r"outputs/benchmark\.json(?:\.prev\d+)?",
    r"outputs/figures/benchmark\.png",
    # .json.prev<n>: an earlier run's results, kept when the command ran again (common.keep_earlier_run)
    r"outputs/train_step\.json(?:\.prev\d+)?",
    r"outputs/residual_add\.json(?:\.prev\d+)?",
    r"outputs/transformer_step\.json(?:\.prev\d+)?",
)
#: The benchmark sweep's files, by the names ``benchmarks.sweep`` gives them (a test checks they agree).
SWEEP_FILES = (
    r"outputs/benchmark-sweep\.run(?:\.after\d+)?\.jsonl(?:\.prev\d+)?",
    r"outputs/benchmark-sweep\.(?:json|md)(?:\.prev\d+)?",
    r"outputs/figures/benchmark_sweep\.png(?:\.prev\d+)?",
)
#: Folders the commands create by these names, removed when empty even if they held nothing.
LAYOUT_FOLDERS = frozenset(GENERATED_TOP_LEVEL) | {
    "outputs/figures",
    "outputs/compile-report",
    "outputs/hydra",
    "outputs/hydra/multirun",
}

#: The record of a run's end in its checkpoint folder (``training.resume.END_RECORD``; a test checks they agree).
END_RECORD = "end.json"
_END = re.escape(END_RECORD)
_HYDRA = r"(?:outputs/hydra|multirun)(?:/[^/]+)+"
_VERSION = r"[^/]+/version_\d+"
_TREES = "|".join(re.escape(t) for t in PYTHON_TREES)
_CACHE = rf"(?:(?:{_TREES})/(?:[^/]+/)*)?{CACHE_DIR_NAME}"
_STATIC_PATTERNS = [
    re.compile(p)
    for p in (
        r"outputs/(?:{})\.json".format("|".join(re.escape(c) for c in REPORT_COMMANDS)),
        r"outputs/figures/(?:{})".format("|".join(re.escape(f) for f in FIGURE_FILES)),
        *BENCHMARK_FILES,
        *SWEEP_FILES,
        r"outputs/compile-report/inductor_output_\d+\.py",
        rf"{_HYDRA}/multirun\.yaml",
        rf"runs/{_VERSION}/(?:events\.out\.tfevents\.[^/]+|hparams\.yaml)",
        r"runs/summary_[^/]+\.(?:md|json)",
        rf"checkpoints/{_VERSION}/(?:step\d+(?:-v\d+)?\.ckpt|last(?:-v\d+)?\.ckpt|final\.ckpt|hpc_ckpt_\d+\.ckpt|\.run\.lock|{_END})",
        r"(?:runs|checkpoints)/\.write-probe\.\d+",
        r"\.pytest_cache/.+",
        rf"{_CACHE}/[^/]+\.pyc",
    )
]
#: The temporary of a file being written (``atomic.temporary_path``: ``.<name>.<pid>.tmp``).
_TEMPORARY = re.compile(r"\.(?P<name>[^/]+)\.\d+\.tmp")
#: The traceback ``train.py`` writes into its Hydra job folder after a crash (``training.cli.TRACEBACK_NAME``;
#: a test checks they agree).
TRACEBACK_NAME = "traceback.txt"
#: Hydra's files of one job, and the crash's traceback, generated only where ``<job>/.hydra/hydra.yaml`` exists.
_HYDRA_JOB_FILE = re.compile(
    rf"(?P<job>{_HYDRA})/(?:\.hydra/(?:config|hydra|overrides)\.yaml|train\.log|{re.escape(TRACEBACK_NAME)})"
)
_LAYOUT_FOLDER = re.compile(rf"(?:runs|checkpoints)/[^/]+(?:/version_\d+)?|\.pytest_cache/.+|{_CACHE}")


def project_name(pyproject: Path) -> str | None:
    """``[project].name`` of a pyproject.toml, or None when there is none or it cannot be read."""
    try:
        text = pyproject.read_text()
    except OSError:
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: read the one field by hand
        m = re.search(r'^\[project\][^\[]*?^name\s*=\s*"([^"]+)"', text, re.M | re.S)
        return m.group(1) if m else None
    try:
        return tomllib.loads(text).get("project", {}).get("name")
    except tomllib.TOMLDecodeError:
        return None


def is_project_root(root: Path) -> bool:
    """Whether ``root`` holds this project's pyproject.toml (then its caches are cleaned too)."""
    return project_name(root / "pyproject.toml") == PROJECT_NAME


def is_generated_file(root: Path, rel: str) -> bool:
    """Whether the file at ``rel`` (relative to ``root``, '/'-separated) is one the project writes, or the
    temporary of one (``atomic.temporary_path``)."""
    if any(p.fullmatch(rel) for p in _STATIC_PATTERNS):
        return True
    folder, _, name = rel.rpartition("/")
    staged = _TEMPORARY.fullmatch(name)
    if staged is not None:
        return is_generated_file(root, f"{folder}/{staged.group('name')}" if folder else staged.group("name"))
    m = _HYDRA_JOB_FILE.fullmatch(rel)
    return bool(m) and (root / m.group("job") / ".hydra" / "hydra.yaml").is_file()


def is_layout_folder(rel: str) -> bool:
    """Whether the folder at ``rel`` is one the commands create by its name."""
    return rel in LAYOUT_FOLDERS or bool(_LAYOUT_FOLDER.fullmatch(rel))
