"""What several measurements of ``benchmarks`` share: their command lines (one-line usage errors, numeric
options with a lower bound, comma-separated choices, Ctrl+C and SIGTERM in one line: the command-line
layer the check commands use too, ``rmsnorm_kernel.checks.cli``), their refusals before any work, and
an earlier run's file kept; reading their JSON files back for ``--table``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from rmsnorm_kernel.checks.cli import OneLineParser, Terminated, at_least, interrupt_status, run_interruptible
from rmsnorm_kernel.jsonio import write_json

__all__ = [
    "INTERPRETED",
    "OneLineParser",
    "cannot_start",
    "Terminated",
    "at_least",
    "comma_choices",
    "file_problem",
    "interrupt_status",
    "keep_earlier_run",
    "keep_previous",
    "run_interruptible",
    "print_table",
    "read_results",
    "write_json",
]


def comma_choices(name: str, accepted: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated subset of ``accepted``, at least one, in the order given,
    each once; ``name`` names one of them in the error ("',' names no implementation")."""
    accepted = tuple(accepted)

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [s for s in names if s not in accepted]
        if unknown or not names:
            what = f"unknown {', '.join(unknown)}" if unknown else f"{text!r} names no {name}"
            raise argparse.ArgumentTypeError(f"{what}; accepted: a comma-separated subset of {','.join(accepted)}")
        return list(dict.fromkeys(names))

    parse.__name__ = name
    return parse


def file_problem(option: str, path: Path | None) -> str | None:
    """Why the file ``path`` given as ``option`` cannot be written (None when it can, or when not given):
    checked before any work, so that a measurement is never lost at its end. It creates nothing: the
    nearest folder of ``path`` that exists is test-written, and the missing ones are made with the file
    (``atomic.write_atomic``), so that a command refused later leaves no folder behind."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        return f"{option} {path} is a folder; accepted: a file in a folder this user can write"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    accepted = "accepted: a file in a folder this user can create and write"
    if not folder.is_dir():
        return f"{option} {path}: {folder} is a file, not a folder; {accepted}"
    probe = folder / f".write-probe.{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"{option} {path}: {folder} cannot be written ({exc.strerror or exc}); {accepted}"
    return None


#: Why a command that runs the kernels needs a CUDA GPU.
INTERPRETED = "on the CPU the kernels run in Triton's interpreter"


def cannot_start(kind: str, json_path: Path | None, has_gpu: bool, needs_gpu_for: str) -> int | None:
    """The refusal every measurement command with a ``--json`` file makes before its work: a path where no
    file can be written (``file_problem``), or no CUDA GPU (``has_gpu``, as the command sees it;
    ``needs_gpu_for`` says what needs one). One line on stderr and exit status 2; None when the command
    may start."""
    problem = file_problem("--json", json_path)
    if problem is None and not has_gpu:
        problem = f"needs a CUDA GPU ({needs_gpu_for}); none found."
    if problem is None:
        return None
    print(f"{kind}: {problem}", file=sys.stderr)
    return 2


def read_results(path: Path, kind: str) -> dict:
    """The results file of the command ``kind`` (its JSON names it in ``"kind"``); ``ValueError`` with a
    one-line reason if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--table {path}: cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--table {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ValueError(f"--table {path}: not a {kind} result; accepted: a file that {kind} wrote")
    return data


def print_table(kind: str, path: Path, markdown: Callable[[dict], str]) -> int:
    """``--table``: the results file of ``kind`` at ``path`` printed by ``markdown``; 0, or 2 with one line."""
    try:
        print(markdown(read_results(path, kind)))
    except ValueError as e:
        print(f"{kind}: {e}", file=sys.stderr)
        return 2
    return 0


def keep_previous(path: Path) -> Path | None:
    """An earlier run's file at ``path`` renamed to ``<path>.prev<n>`` (the first n free), so that running
    again never loses a measurement; returns the new name, or None when there was no file."""
    path = Path(path)
    if not path.exists():
        return None
    n = 1
    while path.with_name(f"{path.name}.prev{n}").exists():
        n += 1
    kept = path.with_name(f"{path.name}.prev{n}")
    path.rename(kept)
    return kept


def exit_status(kind: str, failed: int, what: str) -> int:
    """A measurement's exit status: 0, or 1 with one line on stderr when ``failed`` of its rows (``what``:
    what went wrong with them, and where the rows are) did."""
    if not failed:
        return 0
    print(f"{kind}: {failed} {what}; exit status 1", file=sys.stderr)
    return 1


def keep_earlier_run(kind: str, path: Path | None) -> None:
    """Before a run's first write to its results file ``path`` (None: it writes none): an earlier run's
    file there is kept (``keep_previous``), and the command ``kind`` says so in one line."""
    kept = None if path is None else keep_previous(path)
    if kept is not None:
        print(f"{kind}: {path} held an earlier run; kept as {kept}")
