"""Removing the files the project's commands wrote, one by one, and nothing else (which files those
are: ``generated``).

Where: the commands write relative to the folder they are started in, and clean works on the folder it
is given (``--project``, default: the folder it is started in): its ``outputs/``, ``runs/``,
``checkpoints/`` and ``multirun/``, wherever that folder is. The caches (``.pytest_cache/`` and the
``__pycache__`` folders of the Python trees) are the project's own, cleaned only when that folder is the
project's root (its ``pyproject.toml`` names this project).

Any other file in those folders is kept and listed as kept. No folder is removed as a whole: after the
files, a folder is removed, deepest first, when it is empty and either held something that was removed
or is a folder of the layout (``generated.LAYOUT_FOLDERS``, ``<runs|checkpoints>/<name>`` and its
``version_<k>``, ``__pycache__``, a folder under ``.pytest_cache``). A folder that still holds a kept file stays, and so
does an empty folder the user made.

A run in use is never touched: a run whose ``checkpoints/<name>/version_<k>/.run.lock`` is held by a
live process (the process id in the file is alive, or the lock is held, as ``training.checkpoints.RunLock``
decides), its checkpoint folder and its TensorBoard folder ``runs/<name>/version_<k>/`` are kept whole
and listed as kept with the process id; so are a Hydra folder ``outputs/hydra/[multirun/]<time>_<pid>``
and a write probe ``.write-probe.<pid>`` whose process is alive. A lock file whose process is dead (a
killed run) holds no lock and is removed with its run's files, as a run that ended is. The lock is
checked again just before each file of a run is removed, so a run that started during the clean is kept.

The dry run makes the same plan and touches nothing. Virtual environments and ``.git`` are never
entered; symbolic links are never followed or removed; every path is checked to lie inside the cleaned
folder before it is removed.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .generated import (
    CACHE_DIR_NAME,
    GENERATED_TOP_LEVEL,
    PYTHON_TREES,
    is_generated_file,
    is_layout_folder,
    is_project_root,
)

#: Directories never searched for caches: they belong to git or to an installed environment.
NEVER_ENTER = {".git", ".venv", "venv", ".tox", ".nox", "node_modules"}
SCOPES = ("generated",)

WOULD_REMOVE, REMOVED = "would remove", "removed"
KEPT_USER = "kept: not written by this project's commands"
KEPT_LINK = "kept: symbolic link, not followed"
KEPT_LIVE = "kept: in use by live process"
#: The lock of a run's checkpoint folder (``training.checkpoints.LOCK_NAME``; a test checks they agree).
LOCK_NAME = ".run.lock"
_RUN_FOLDER = re.compile(r"(?:runs|checkpoints)/(?P<name>[^/]+)/(?P<version>version_\d+)(?:/.*)?")
_PID_NAMED = re.compile(
    r"outputs/hydra/(?:multirun/)?[^/]+_(?P<pid>\d+)|(?:runs|checkpoints)/\.write-probe\.(?P<probe>\d+)"
)


class CleanRefused(RuntimeError):
    """``clean`` will not run as asked; the message says why and what is accepted."""


@dataclass
class Removal:
    """One path and what ``clean`` does with it. ``path`` is relative to the project root, with a
    trailing ``/`` for a folder; ``action`` is "would remove", "removed", "kept: <why>" or
    "not removed: <error>"."""

    path: str
    action: str

    @property
    def is_folder(self) -> bool:
        return self.path.endswith("/")


def folder_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be cleaned (None when it can): it must be an existing folder."""
    if not Path(directory).is_dir():
        what = "does not exist" if not Path(directory).exists() else "is not a folder"
        return f"--project {directory} {what}; accepted: the folder the commands were started in (default: .)"
    return None


# --------------------------------------------------------------------------------------------------
# Runs in use


def pid_alive(pid: int) -> bool:
    """Whether a process of id ``pid`` exists (one of another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def lock_holder(lock: Path) -> str | None:
    """The holder of the run lock ``lock`` (its process id, or "unknown"), or None when no live process
    holds it. As ``training.checkpoints.RunLock``: the lock is an ``flock`` on the file, released by the
    operating system when its process ends, and the file records the holder's process id. A recorded
    process that is alive holds it; otherwise the lock itself is asked, without waiting (a process that
    has not written its id yet, or one in another process namespace)."""
    import fcntl

    try:
        text = lock.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError:
        return "unknown"  # cannot tell: keep the run
    if text.isdigit() and pid_alive(int(text)):
        return text
    try:
        fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return "unknown"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return text if text.isdigit() else "unknown"
    finally:
        os.close(fd)  # closing releases a lock taken just now
    return None


def live_folders(root: Path) -> dict[str, str]:
    """The folders (relative to ``root``) a live process is writing, with why each is kept: each run's
    checkpoint and TensorBoard folders whose lock is held, and the folders and probes named for a live
    process."""
    live: dict[str, str] = {}
    checkpoints = root / "checkpoints"
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        for lock in sorted(checkpoints.glob(f"*/version_*/{LOCK_NAME}")):
            if lock.parent.is_symlink() or lock.parent.parent.is_symlink() or lock.is_symlink():
                continue
            holder = lock_holder(lock)
            if holder is None:
                continue
            rel_lock = lock.relative_to(root).as_posix()
            name, version = lock.parent.parent.name, lock.parent.name
            why = f"{KEPT_LIVE} {holder} (it holds {rel_lock}): the run is being written"
            live[f"checkpoints/{name}/{version}"] = why
            live[f"runs/{name}/{version}"] = why
    for pattern in (
        "outputs/hydra/*_*",
        "outputs/hydra/multirun/*_*",
        "runs/.write-probe.*",
        "checkpoints/.write-probe.*",
    ):
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            m = _PID_NAMED.fullmatch(rel)
            if m and not path.is_symlink() and pid_alive(int(m.group("pid") or m.group("probe"))):
                live[rel] = f"{KEPT_LIVE} {m.group('pid') or m.group('probe')} (named for it): it may be writing it"
    return live


def _run_in_use(root: Path, rel: str) -> str | None:
    """Why ``rel``, a path in a run's folder, must be kept now (its run's lock is held), or None."""
    m = _RUN_FOLDER.fullmatch(rel.rstrip("/"))
    if m is None:
        return None
    lock = root / "checkpoints" / m.group("name") / m.group("version") / LOCK_NAME
    holder = lock_holder(lock) if lock.exists() else None
    return None if holder is None else f"{KEPT_LIVE} {holder}: the run started during the clean"


def _is_environment(path: Path) -> bool:
    return path.name in NEVER_ENTER or (path / "pyvenv.cfg").exists()


def _plan_folder(
    root: Path, folder: Path, remove: list[str], kept: list[Removal], live: dict[str, str]
) -> tuple[bool, bool]:
    """Sort the contents of ``folder`` into ``remove`` and ``kept`` (``live``: the paths kept whole, with
    why); returns (it would be empty after the clean, something in it would be removed)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        kept.append(Removal(folder.relative_to(root).as_posix() + "/", f"kept: cannot be read ({type(exc).__name__})"))
        return False, False
    empty, removed_any = True, False
    for entry in entries:
        path = Path(entry.path)
        rel = path.relative_to(root).as_posix()
        if entry.is_symlink():
            kept.append(Removal(rel, KEPT_LINK))
            empty = False
        elif rel in live:
            kept.append(Removal(rel + ("/" if entry.is_dir(follow_symlinks=False) else ""), live[rel]))
            empty = False
        elif entry.is_dir(follow_symlinks=False):
            if _is_environment(path):
                kept.append(Removal(rel + "/", "kept: a virtual environment, not entered"))
                empty = False
                continue
            sub_empty, sub_removed = _plan_folder(root, path, remove, kept, live)
            if sub_empty and (sub_removed or is_layout_folder(rel)):
                remove.append(rel + "/")
                removed_any = True
            else:
                if sub_empty:  # an empty folder the user made: listed, since it keeps its parent
                    kept.append(Removal(rel + "/", "kept: empty folder not made by this project's commands"))
                empty = False
        elif entry.is_file(follow_symlinks=False) and is_generated_file(root, rel):
            remove.append(rel)
            removed_any = True
        else:
            kept.append(Removal(rel, KEPT_USER if entry.is_file(follow_symlinks=False) else "kept: not a regular file"))
            empty = False
    return empty, removed_any


def _cache_folders(root: Path) -> list[Path]:
    """The ``__pycache__`` folders of the root and of the project's Python trees (no link followed,
    no environment entered)."""
    found = (
        [root / CACHE_DIR_NAME] if (root / CACHE_DIR_NAME).is_dir() and not (root / CACHE_DIR_NAME).is_symlink() else []
    )
    for tree in PYTHON_TREES:
        top = root / tree
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(top, followlinks=False):
            here = Path(dirpath)
            keep = []
            for d in sorted(dirnames):
                child = here / d
                if child.is_symlink() or _is_environment(child):
                    continue
                if d == CACHE_DIR_NAME:
                    found.append(child)
                else:
                    keep.append(d)
            dirnames[:] = keep
    return found


def plan(root: Path) -> tuple[list[str], list[Removal]]:
    """(paths to remove, files first and then folders deepest first; what is kept, with the reason)."""
    files_and_folders: list[str] = []
    kept: list[Removal] = []
    live = live_folders(root)
    project = is_project_root(root)
    tops = GENERATED_TOP_LEVEL if project else tuple(n for n in GENERATED_TOP_LEVEL if n != ".pytest_cache")
    folders = [root / name for name in tops] + (_cache_folders(root) if project else [])
    for folder in folders:
        rel = folder.relative_to(root).as_posix()
        if folder.is_symlink():
            kept.append(Removal(rel, KEPT_LINK))
        elif folder.is_dir():
            empty, removed_any = _plan_folder(root, folder, files_and_folders, kept, live)
            if empty and (removed_any or is_layout_folder(rel)):
                files_and_folders.append(rel + "/")
        elif folder.exists():
            kept.append(Removal(rel, "kept: not a folder"))
    files = sorted(p for p in files_and_folders if not p.endswith("/"))
    dirs = sorted((p for p in files_and_folders if p.endswith("/")), key=lambda p: (-p.count("/"), p))
    return files + dirs, sorted(kept, key=lambda r: r.path)


def _remove(root: Path, rel: str) -> str:
    """Remove one planned path, after checking that it still is what was planned and lies in ``root``."""
    path = root / rel.rstrip("/")
    in_use = _run_in_use(root, rel)
    if in_use is not None:
        return in_use
    try:
        parent = path.parent.resolve()
        if parent != root and root not in parent.parents:
            return "kept: resolves outside the project"
        mode = os.lstat(path).st_mode
        if rel.endswith("/"):
            if not stat.S_ISDIR(mode):
                return "kept: no longer a folder"
            os.rmdir(path)  # fails on a folder that is not empty: nothing in it is lost
        else:
            if not stat.S_ISREG(mode):
                return "kept: no longer a regular file"
            os.unlink(path)
    except FileNotFoundError:
        return "kept: already gone"
    except OSError as exc:
        return f"not removed: {type(exc).__name__}: {exc.strerror or exc}"
    return REMOVED


def clean_generated(directory: Path, dry_run: bool) -> list[Removal]:
    """Remove (or, with ``dry_run``, list) the generated files under ``directory`` (see the module's
    docstring), then the folders they leave empty; returns every path removed and every path kept, sorted."""
    problem = folder_problem(directory)
    if problem is not None:
        raise CleanRefused(problem)
    root = Path(directory).resolve()
    targets, kept = plan(root)
    done = [Removal(rel, WOULD_REMOVE if dry_run else _remove(root, rel)) for rel in targets]
    return sorted(done + kept, key=lambda r: r.path)


def argument_problem(directory: Path, outputs: Path | None) -> str | None:
    """What is wrong with clean's ``--project`` and ``--outputs``, checked before anything is removed
    (None when nothing). ``--outputs`` is created and test-written then, as every command's is."""
    from .report import outputs_problem

    problem = folder_problem(directory)
    if problem is None and outputs is not None:
        problem = report_folder_problem(directory, outputs)
        if problem is None:
            unwritable = outputs_problem(outputs)
            problem = unwritable
    return problem


def report_folder_problem(directory: Path, outputs: Path) -> str | None:
    """Why ``outputs`` may not hold clean's own report (it lies in a folder clean cleans), or None."""
    root = Path(directory).resolve()
    where = Path(outputs).resolve()
    cleaned = [root / name for name in GENERATED_TOP_LEVEL]
    inside = next((c for c in cleaned if where == c or c in where.parents), None)
    if inside is None and CACHE_DIR_NAME in where.parts:
        inside = Path(CACHE_DIR_NAME)
    if inside is None:
        return None
    return (
        f"--outputs {outputs} lies in {inside}, which clean cleans; accepted: a folder outside "
        f"{', '.join(GENERATED_TOP_LEVEL)} and {CACHE_DIR_NAME}, or no --outputs (the table is printed only)"
    )
