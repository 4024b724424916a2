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


def test_a_broken_anchor_fails_the_docs_check(tmp_path: Path) -> None:
    root = docs_copy(tmp_path)
    page = root / "docs" / "clusters.md"
    page.write_text(page.read_text() + "\nSee [nowhere](peers.md#no-such-heading-here).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading-here" in done.stderr, done.stderr[-3000:]


def test_a_link_to_a_missing_page_fails_the_docs_check(tmp_path: Path) -> None:
    root = docs_copy(tmp_path)
    page = root / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [gone](no-such-page.md).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr, done.stderr[-3000:]
