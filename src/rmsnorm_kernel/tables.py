"""Tables: the one printer of the project's tables, for the terminal and for Markdown pages.

Built on ``tabulate``: it lays out columns from plain strings, with no terminal behind it, so the same
rows give the same text in a terminal, a pipe, a log or a test; and it writes Markdown (GitHub's pipe
tables) from the same call. Every value goes through ``cell`` first, so a table reads the same whichever
command prints it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tabulate import tabulate


def cell(v) -> str:
    """A value as a table shows it: yes/no, three significant digits, '-' for NaN, tuples in parentheses."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3g}"
    if isinstance(v, tuple):
        return "(" + ", ".join(map(str, v)) + ")"
    return str(v)


def table(
    headers: Sequence,
    rows: Iterable[Sequence],
    right: Iterable[int] = (),
    groups: Sequence | None = None,
    markdown: bool = False,
) -> str:
    """``rows`` under ``headers``, each value as ``cell`` writes it; the columns in ``right`` aligned right,
    the others left; a row shorter than the headers is filled with empty cells.

    In the terminal (the default): columns two spaces apart under a line of dashes, and a blank line
    wherever ``groups`` (one key per row) changes. With ``markdown``: a Markdown table for a page, where
    ``groups`` is ignored (a Markdown table has no blank rows)."""
    right = set(right)
    cells = [[cell(v) for v in row] + [""] * (len(headers) - len(row)) for row in rows]
    colalign = ["right" if i in right else "left" for i in range(len(headers))]
    text = tabulate(
        cells,
        headers=[str(h) for h in headers],
        tablefmt="github" if markdown else "simple",
        colalign=colalign,
        disable_numparse=True,
    )
    lines = [line.rstrip() for line in text.splitlines()]
    if markdown or groups is None:
        return "\n".join(lines)
    head, body = lines[:2], lines[2:]
    out = list(head)
    for i, line in enumerate(body):
        if i and groups[i] != groups[i - 1]:
            out.append("")
        out.append(line)
    return "\n".join(out)
