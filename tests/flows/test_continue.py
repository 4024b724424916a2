"""`--resume RUN --steps N` continues a finished run: the steps it adds are the steps a run
of N steps from the start would have taken (sampling and data order are seeded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.cluster.start import ClusterConfig
from flows.runs.record import load_run
from flows.train import TrainParams, train
from storage.store import MEGStore
from tests.flows.conftest import write_config

pytestmark = pytest.mark.slow


def step_samples(out: dict[str, Any], agent: str, step: int) -> list[tuple[str, list[int]]]:
    table = MEGStore.open(out["store_url"], out["run_id"], create=False).table(agent)
    rows = table.read(step=step)
    return sorted((str(s), rows.response(i).tolist()) for i, s in enumerate(rows.sample_id))


def test_a_finished_run_continues_to_more_steps_like_a_longer_run(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=2, episodes_per_step=4)
    where = ClusterConfig(scheduler=cluster)
    common: dict[str, Any] = dict(cluster=where, export_final=False)
    short = train(TrainParams(config=str(cfg), run_dir=str(tmp_path / "short"), **common))
    assert short["steps"] == 2
    more = train(TrainParams(resume=str(tmp_path / "short"), steps=3, **common))
    assert [r["step"] for r in more["per_step"]] == [2]  # only the added step ran
    assert more["run_id"] == short["run_id"] and more["consistency"]["violations"] == 0
    assert load_run(tmp_path / "short").ctx.steps == 3
    full = train(TrainParams(config=str(cfg), run_dir=str(tmp_path / "full"), steps=3, **common))
    for agent in ("solver", "verifier"):
        store = MEGStore.open(more["store_url"], more["run_id"], create=False)
        assert sorted(store.table(agent).consumption_log()) == [0, 1, 2]
        assert step_samples(more, agent, 2) == step_samples(full, agent, 2)
