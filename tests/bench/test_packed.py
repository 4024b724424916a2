"""A folder of per-run JSON dumps and the one file `bench.packed` makes of it read the same,
and the simulator's fit reads either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.packed import members, pack
from bench.sim.fit import timelines


def runs_folder(root: Path) -> Path:
    folder = root / "e2e_runs"
    folder.mkdir()
    for r in range(2):
        tasks = [
            {"phase": "generate", "step": s, "agent": "a", "start": 0.0, "end": 1.0 + r}
            for s in range(3)
        ]
        (folder / f"fanout-flex-{r}.timeline.json").write_text(json.dumps(tasks))
        (folder / f"fanout-flex-{r}.summary.json").write_text(json.dumps({"steps": 3}))
    (folder / "fanout-sync-0.timeline.json").write_text(json.dumps([]))
    return folder


def test_a_packed_folder_reads_as_the_folder(tmp_path: Path) -> None:
    folder = runs_folder(tmp_path)
    packed = pack(folder, tmp_path / "e2e_runs.json")
    assert members(packed) == members(folder)
    assert set(members(packed)) == {p.name for p in folder.iterdir()}
    assert not (tmp_path / "e2e_runs.tmp").exists()  # written whole, then renamed
    # the fit's reader: the same repeats, steps >= 1 only, from either form
    assert timelines(packed, "fanout", "flex") == timelines(folder, "fanout", "flex")
    got = timelines(packed, "fanout", "flex")
    assert len(got) == 2 and all(t["step"] >= 1 for run in got for t in run)


def test_bad_sources_are_refused_with_their_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*\.json files to pack"):
        pack(tmp_path / "empty", tmp_path / "out.json")
    with pytest.raises(FileNotFoundError, match="neither a folder of runs nor a packed file"):
        members(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a packed file"):
        members(tmp_path / "list.json")


def test_the_reference_runs_are_in_git_as_one_file() -> None:
    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    packed = members(results / "e2e_runs.json")
    assert len(timelines(results / "e2e_runs.json", "fanout", "flex")) == 3
    assert all(name.endswith((".timeline.json", ".summary.json")) for name in packed)
