"""The one table printer: cells written readably, columns aligned, groups apart, and Markdown from the
same rows."""

import math

from rmsnorm_kernel.tables import table
from tests.helpers import markdown_rows


def test_table_aligns_columns_and_writes_cells_readably():
    text = table(["a", "value"], [(True, 1.23456e-7), ("long name", math.nan), ((1, 257), 2)])
    assert text.splitlines() == [
        "a          value",
        "---------  --------",
        "yes        1.23e-07",
        "long name  -",
        "(1, 257)   2",
    ]


def test_table_aligns_chosen_columns_right_and_separates_groups():
    text = table(("name", "us"), [("a", "1.5"), ("bbb", "10.25"), ("c", "2")], right=(1,), groups=[1, 1, 2])
    assert text.splitlines() == [
        "name       us",
        "------  -----",
        "a         1.5",
        "bbb     10.25",
        "",
        "c           2",
    ]


def test_a_short_row_is_filled_with_empty_cells_and_no_line_ends_in_spaces():
    text = table(("path", "mode", "ms"), [("triton", "compile", "1.5"), ("native", "failed: boom")])
    assert text.splitlines()[3] == "native  failed: boom"
    assert all(line == line.rstrip() for line in text.splitlines())


def test_markdown_holds_the_same_cells_as_the_terminal_table():
    rows = [(True, 1.23456e-7), ("long name", math.nan), ((1, 257), 2)]
    text = table(["a", "value"], rows, right=(1,), groups=[1, 2, 2], markdown=True)
    lines = text.splitlines()
    assert lines[0].startswith("| a ") and set(lines[1]) <= set("|-:") and len(lines) == 5  # no blank group rows
    assert markdown_rows(text) == [["a", "value"], ["yes", "1.23e-07"], ["long name", "-"], ["(1, 257)", "2"]]


def test_a_table_without_rows_is_its_header():
    assert table(("name", "us"), []).splitlines() == ["name    us", "------  ----"]
