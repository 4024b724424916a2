"""The site's front page (docs/index.md) is the README's front page, links rewritten for the
site: two copies of one text, kept from drifting apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _front(text: str, end: str) -> list[str]:
    lines = text.splitlines()
    return lines[: lines.index(end)]


def test_index_is_the_readme_with_site_links() -> None:
    readme = (ROOT / "README.md").read_text()
    site = re.sub(r"\]\(docs/", "](", readme)
    site = re.sub(r"\]\(bench/results/([^)]+\.png)\)", r"](assets/\1)", site)
    index = (ROOT / "docs" / "index.md").read_text()
    assert _front(site, "## Documentation") == _front(index, "## Read on")


def test_every_picture_the_site_shows_is_a_copy_of_the_benchmark_result() -> None:
    for png in (ROOT / "docs" / "assets").glob("*.png"):
        result = ROOT / "bench" / "results" / png.name
        assert result.exists() and result.read_bytes() == png.read_bytes(), png.name
