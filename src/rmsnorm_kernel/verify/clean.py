"""Removing what the project's commands generate, and nothing else.

Only inside a directory whose ``pyproject.toml`` declares this project: the top-level ``outputs/``,
``runs/``, ``checkpoints/``, ``multirun/`` and ``.pytest_cache/``, and ``__pycache__/`` directories
below it. Virtual environments and ``.git`` are never entered, symbolic links are never followed or
removed, and every path is checked to lie inside the project before it is touched.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

PROJECT_NAME = "rmsnorm_kernel"
GENERATED_TOP_LEVEL = ("outputs", "runs", "checkpoints", "multirun", ".pytest_cache")
CACHE_DIR_NAME = "__pycache__"
#: Directories never searched for caches: they belong to git or to an installed environment.
NEVER_ENTER = {".git", ".venv", "venv", ".tox", ".nox", "node_modules"}
SCOPES = ("generated",)


class NotTheProject(RuntimeError):
    """The directory given to ``clean`` is not this project's root."""


@dataclass
class Removal:
    path: str
    action: str  # "would remove", "removed" or "skipped: <why>"


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


def require_project_root(directory: Path) -> Path:
    """``directory`` resolved, if it holds this project's pyproject.toml; else ``NotTheProject``."""
    root = Path(directory).resolve()
    name = project_name(root / "pyproject.toml")
    if name != PROJECT_NAME:
        found = "no pyproject.toml" if not (root / "pyproject.toml").is_file() else f"a pyproject.toml of project {name!r}"
        raise NotTheProject(
            f"clean: {root} has {found}; accepted: the root of the {PROJECT_NAME} project "
            f"(the directory whose pyproject.toml has name = \"{PROJECT_NAME}\"); run it there or pass --project"
        )
    return root


def _is_environment(path: Path) -> bool:
    return path.name in NEVER_ENTER or (path / "pyvenv.cfg").exists()


def generated_paths(root: Path) -> tuple[list[Path], list[Removal]]:
    """(directories to remove, entries that look generated but are left alone, with the reason)."""
    targets, skipped = [], []
    for name in GENERATED_TOP_LEVEL:
        p = root / name
        if p.is_symlink():
            skipped.append(Removal(str(p), "skipped: symbolic link, not followed"))
        elif p.is_dir():
            targets.append(p)
        elif p.exists():
            skipped.append(Removal(str(p), "skipped: not a directory"))
    top_level = {root / n for n in GENERATED_TOP_LEVEL}
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in dirnames:
            child = here / d
            if child in top_level or child.is_symlink() or _is_environment(child):
                continue
            if d == CACHE_DIR_NAME:
                targets.append(child)
            else:
                keep.append(d)
        dirnames[:] = keep  # do not descend into what is removed, linked, or an environment
    return targets, skipped


def clean_generated(directory: Path, dry_run: bool) -> list[Removal]:
    """Remove (or, with ``dry_run``, list) the generated directories of the project rooted at ``directory``."""
    root = require_project_root(directory)
    targets, report = generated_paths(root)
    for p in targets:
        resolved = p.resolve()
        if resolved == root or root not in resolved.parents:
            report.append(Removal(str(p), "skipped: resolves outside the project"))
            continue
        if dry_run:
            report.append(Removal(str(p), "would remove"))
        else:
            shutil.rmtree(p)
            report.append(Removal(str(p), "removed"))
    return report
