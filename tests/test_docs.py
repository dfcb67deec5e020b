"""The README and the pages under docs/: every relative link reaches a file, and an anchor a heading of
that file; no page under docs/ is named after a date (history lives in git, not in file names)."""

import re

import pytest

from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to dashes."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and (m := re.match(r"#+ (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def links(page) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: `kernel[grid](...)` is no link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# The API\n## `model=large`: a larger network\n```\n# not a heading\n```\n")
    assert anchors(page) == {"the-api", "modellarge-a-larger-network"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_no_file_under_docs_is_named_after_a_date():
    dated = [p.name for p in (ROOT / "docs").rglob("*") if re.search(r"\d{4}-\d{2}-\d{2}|\d{8}", p.name)]
    assert dated == []
