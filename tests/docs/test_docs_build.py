"""The docs check (`mkdocs build --strict`, as `make test` runs it) can fail: a broken anchor
in a copy of the docs aborts the build, and the docs as they are build clean.

With `--quiet` mkdocs logs errors only, so the warnings that `--strict` counts were never
emitted and the check passed over a broken anchor; the Makefile runs it without `--quiet`
and this test keeps it honest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """The Makefile's docs check on the project copy at `root`."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def docs_copy(dest: Path) -> Path:
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    return dest


def test_the_docs_build_strict_without_a_warning(tmp_path: Path) -> None:
    done = build(docs_copy(tmp_path), tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("page", "link", "named"),
    [
        ("clusters.md", "[nowhere](peers.md#no-such-heading-here)", "no-such-heading-here"),
        ("index.md", "[gone](no-such-page.md)", "no-such-page.md"),
    ],
    ids=["broken-anchor", "missing-page"],
)
def test_a_broken_link_fails_the_docs_check(
    tmp_path: Path, page: str, link: str, named: str
) -> None:
    root = docs_copy(tmp_path)
    doc = root / "docs" / page
    doc.write_text(doc.read_text() + f"\nSee {link}.\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert named in done.stderr, done.stderr[-3000:]
