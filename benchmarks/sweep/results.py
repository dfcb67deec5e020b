"""The sweep's results file: JSON lines, appended while a run measures, read back as runs.

A file holds one run or several, one after the other (files of runs concatenate into one file). Each line
is one JSON object, and its ``kind`` says what it is:

- ``benchmark-sweep-run`` (``RUN_KIND``): a run starts; the line holds what the run is (the sweep and its
  definition hash, the implementations, the device, the versions, the commit, the date, the protocol);
- ``point``: one point measured, written when the point ends: its fields (``POINT_KEYS``) once, and its
  rows (one per implementation and direction) without them and without what follows from the rest (the
  bandwidths, the share of the ceiling: ``DERIVED_KEYS``), times rounded to ``DIGITS`` significant digits;
- ``ceiling``: one measurement of a regime's copy ceiling;
- ``end``: the run ended, with its seconds, whether it measured every point it had to, and the points left.

A run cut short (a killed process) leaves every point it measured and no ``end`` line: it reads back as
incomplete. Appending a line per point keeps the cost of writing a point constant, whatever the run's
length.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from rmsnorm_kernel.jsonio import dumps, plain

from ..rows import tbps
from .measure import Row

RUN_KIND = "benchmark-sweep-run"
POINT, CEILING, END = "point", "ceiling", "end"
#: What a point's rows share, written once on its line.
POINT_KEYS = ("point", "regime", "origin", "split", "M", "N", "dtype", "repeat")
#: What a row's other fields give (``expand``), and the index a merge gives it: not written.
DERIVED_KEYS = ("whole_tbps", "gpu_tbps", "ceiling_tbps", "pct_of_ceiling", "session")
DIGITS = 6
#: A row's fields and their defaults, for rows that leave a default out.
ROW_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Row) if f.default is not dataclasses.MISSING}


def _round(value):
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.{DIGITS}g}")
    return value


def _line(obj: dict) -> str:
    return dumps(obj, indent=None) + "\n"


def point_line(rows: Sequence[Row | dict]) -> str:
    """One point's rows as its line; every row must be of the same point and repeat."""
    rows = [plain(r) for r in rows]
    head = {k: rows[0][k] for k in POINT_KEYS}
    if any({k: r[k] for k in POINT_KEYS} != head for r in rows):
        raise ValueError(f"rows of several points on one line: {sorted({r['point'] for r in rows})}")
    compact = [
        {
            k: _round(v)
            for k, v in r.items()
            if k not in POINT_KEYS and k not in DERIVED_KEYS and not (k in ROW_DEFAULTS and v == ROW_DEFAULTS[k])
        }
        for r in rows
    ]
    return _line(dict(kind=POINT, **head, rows=compact))


def expand(line: dict) -> list[dict]:
    """A point line's rows, whole again: the point's fields, the defaults, and the bandwidths."""
    head = {k: line[k] for k in POINT_KEYS}
    out = []
    for r in line["rows"]:
        if not isinstance(r, dict):
            raise ValueError(f"a row of {line.get('point')} is not an object")
        row = {**ROW_DEFAULTS, **head, **r}
        row["whole_tbps"] = tbps(row["bytes"], row["whole_us"] and row["whole_us"] / 1e6)
        row["gpu_tbps"] = tbps(row["bytes"], row["gpu_us"] and row["gpu_us"] / 1e6)
        out.append(row)
    return out


class RunFile:
    """One run's lines appended to ``path``: the run's line when made, then what ``__call__`` is given
    that it has not written yet (``run.run_points``'s ``write``). Each line is written whole with one
    ``write`` and flushed, so a reader meets whole lines only (a killed run may leave a last part line,
    which reading skips)."""

    def __init__(self, path: Path, meta: dict):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = self.ceilings = 0
        self._append(_line(dict(meta, kind=RUN_KIND)), mode="w")

    def _append(self, text: str, mode: str = "a") -> None:
        with open(self.path, mode) as f:
            f.write(text)

    def __call__(self, rows: Sequence[Row], ceilings: Sequence[dict], remaining, elapsed_s: float, done=False):
        text = "".join(_line(dict(kind=CEILING, **c)) for c in ceilings[self.ceilings :])
        new = rows[self.rows :]
        groups: dict[tuple, list] = {}
        for r in new:
            groups.setdefault((r.point, r.repeat), []).append(r)
        text += "".join(point_line(g) for g in groups.values())
        if done:
            text += _line(
                dict(kind=END, elapsed_s=elapsed_s, complete=not remaining, remaining=[p.id for p in remaining])
            )
        self.rows, self.ceilings = len(rows), len(ceilings)
        if text:
            self._append(text)


def run_lines(run: dict) -> str:
    """A run held as a dict (``read_runs``'s form) as its lines: for files made from runs read elsewhere."""
    meta = {k: v for k, v in run.items() if k not in ("rows", "ceilings", "elapsed_s", "complete", "remaining", "file")}
    text = _line(dict(meta, kind=RUN_KIND))
    for c in run["ceilings"]:
        text += _line(dict(kind=CEILING, **{k: v for k, v in c.items() if k != "session"}))
    groups: dict[tuple, list] = {}
    for r in run["rows"]:
        groups.setdefault((r["point"], r.get("repeat", 0)), []).append(r)
    text += "".join(point_line(g) for g in groups.values())
    if "complete" in run:
        text += _line(
            dict(kind=END, elapsed_s=run.get("elapsed_s"), complete=run["complete"], remaining=run.get("remaining", []))
        )
    return text


def read_runs(path: Path) -> list[dict]:
    """The runs of the file at ``path``, each as one dict: the run's line, ``elapsed_s``, ``complete``,
    ``remaining``, ``ceilings`` and ``rows`` (whole, ``expand``). ValueError naming the line for a line
    that is none of the kinds above, or a file that does not start with a run's line; a last line cut
    short (a killed run) is left out."""
    lines = Path(path).read_text().split("\n")
    runs: list[dict] = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: a write the run did not finish
                break
            raise ValueError(f"line {number} is not JSON") from None
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind == RUN_KIND:
            runs.append(dict(obj, elapsed_s=None, complete=False, remaining=None, ceilings=[], rows=[]))
            continue
        if not runs:
            raise ValueError(f"line {number} comes before any run's line: not written by a run of the sweep")
        run = runs[-1]
        try:
            if kind == POINT:
                run["rows"] += expand(obj)
            elif kind == CEILING:
                run["ceilings"].append({k: v for k, v in obj.items() if k != "kind"})
            elif kind == END:
                run.update(elapsed_s=obj["elapsed_s"], complete=bool(obj["complete"]), remaining=obj["remaining"])
            else:
                raise ValueError(f"its kind {kind!r} is none of {RUN_KIND}, {POINT}, {CEILING}, {END}")
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"line {number}: {detail}") from None
    if not runs:
        raise ValueError("no run's line: not written by a run of the sweep")
    return runs
