"""Elastic training allocation on a real cluster: a moved agent's state is handed over through
the StateStore and training goes on exactly as if it had stayed; a run killed by SIGKILL
after a move resumes with a clean audit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import flows.orchestrator.placement as placement
from bench.elastic import build_models, skewed_training_meg
from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.store import MEGStore
from tests.flows.conftest import kill_cli_train_when, write_config
from tests.flows.report.test_logs import run_logs
from tests.flows.scripted_allocator import scripted
from tests.flows.test_continue import step_samples

pytestmark = pytest.mark.slow


def losses(out: dict[str, Any], agent: str) -> list[float]:
    table = MEGStore.open(out["store_url"], out["run_id"], create=False).table(agent)
    log = table.consumption_log()
    return [log[k]["extra"]["loss"] for k in sorted(log)]


def test_a_moved_agent_trains_on_exactly_as_if_it_had_stayed(
    tmp_path: Path, tiny_model: str, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=4, episodes_per_step=4)
    common: dict[str, Any] = dict(
        config=str(cfg), cluster=ClusterConfig(scheduler=cluster), export_final=False
    )
    fixed = train(TrainParams(run_dir=str(tmp_path / "fixed"), **common))
    away = {("verifier", 1), ("verifier", 2), ("solver", 2)}
    monkeypatch.setattr(placement, "ElasticAllocator", scripted(away))
    since = datetime.now(UTC)
    moved = train(TrainParams(run_dir=str(tmp_path / "moved"), elastic=True, **common))
    # the allocator's decisions are in the flow run's log, the right way round
    said = {m for _, m in run_logs(since=since) if m.startswith("elastic allocation")}
    assert "elastic allocation: verifier trains on rollout-0 (was train-0)" in said
    assert "elastic allocation: solver trains on rollout-0 (was train-0)" in said

    # in completion order, which two handovers of one step need not keep
    hops = sorted((h["step"], h["agent"], h["source"], h["target"]) for h in moved["handovers"])
    assert hops == [
        (1, "verifier", "train-0", "rollout-0"),
        (2, "solver", "train-0", "rollout-0"),
        (3, "solver", "rollout-0", "train-0"),
        (3, "verifier", "rollout-0", "train-0"),
    ]
    assert all(h["mib"] > 0 for h in moved["handovers"])  # the state itself travelled
    assert not list((tmp_path / "moved").rglob("slots/*/state.json"))  # each one taken
    assert len(moved["per_step"]) == 4 and moved["consistency"]["violations"] == 0
    for agent in ("solver", "verifier"):
        for k in range(4):
            assert step_samples(moved, agent, k) == step_samples(fixed, agent, k), (agent, k)
        assert np.array_equal(losses(moved, agent), losses(fixed, agent))
    assert fixed["handovers"] == []


def test_lora_agents_on_one_base_move_together(
    tmp_path: Path, tiny_model: str, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two adapters on one base are one unit: both move (and back), each adapter's state
    handed over, and the run equals the fixed one."""
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=3, episodes_per_step=4)
    data = yaml.safe_load(cfg.read_text())
    for agent in data["agents"].values():
        agent["lora"] = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    cfg.write_text(yaml.safe_dump(data))
    common: dict[str, Any] = dict(
        config=str(cfg), cluster=ClusterConfig(scheduler=cluster), export_final=False
    )
    fixed = train(TrainParams(run_dir=str(tmp_path / "fixed"), **common))
    monkeypatch.setattr(placement, "ElasticAllocator", scripted({(None, 1)}))
    moved = train(TrainParams(run_dir=str(tmp_path / "moved"), elastic=True, **common))
    hops = sorted((h["agent"], h["step"], h["target"]) for h in moved["handovers"])
    assert hops == [
        ("solver", 1, "rollout-0"),
        ("solver", 2, "train-0"),
        ("verifier", 1, "rollout-0"),
        ("verifier", 2, "train-0"),
    ]
    assert all(h["mib"] > 0 for h in moved["handovers"])
    assert moved["consistency"]["violations"] == 0
    for agent in ("solver", "verifier"):
        for k in range(3):
            assert step_samples(moved, agent, k) == step_samples(fixed, agent, k), (agent, k)
        assert np.array_equal(losses(moved, agent), losses(fixed, agent))


def test_sigkill_after_a_move_resumes_with_a_clean_audit(
    tmp_path: Path, prefect_server: str, cluster: str
) -> None:
    """The skewed-training workload (two wide agents' training on the one training worker, a
    light rollout) with the critic's training moved to the rollout worker from step 2: the
    run is killed as soon as the handover is logged (the state may be in flight) and resumed
    on another cluster, where the real allocator places training from then on. The move is
    scripted (`tests.flows.scripted_allocator`): whether the measured policy moves, and when,
    depends on the machine's speeds, and the kill must land on a move. Four steps of four
    episodes: the move (and the kill) comes at step 2, and the resume has two steps left to
    place (it had eight, of twice the episodes, each a wide model's training)."""
    steps = 4
    small, wide = build_models(tmp_path / "models")
    cfg = tmp_path / "skewed.yaml"
    meg = skewed_training_meg(small, wide, steps=steps, episodes_per_step=4, elastic=True)
    cfg.write_text(yaml.safe_dump(meg))
    run_dir, log = tmp_path / "run", tmp_path / "run.log"

    def moved() -> bool:
        return log.exists() and "training moved" in log.read_text()

    away = json.dumps([["critic", k] for k in range(2, steps)])
    entry = ("-m", "tests.flows.scripted_allocator", away)
    kill_cli_train_when(moved, cfg, run_dir, prefect_server, log, "a training move", entry)
    assert not (run_dir / "summary.json").exists()

    where = ClusterConfig(scheduler=cluster)
    out = train(TrainParams(resume=str(run_dir), cluster=where, export_final=False))
    assert out["consistency"]["violations"] == 0
    assert out["consistency"]["accounting_errors"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    for agent in ("solver", "checker", "critic"):
        table = store.table(agent)
        assert sorted(table.consumption_log()) == list(range(steps))
        ids = table.read().sample_id
        assert len(np.unique(ids)) == len(ids)
