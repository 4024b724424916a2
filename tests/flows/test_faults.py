"""Faults with real processes: SIGKILL of the whole run, then --resume; a rollout worker
killed in the middle of a step; a training worker killed between two micro-batches."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flows.cluster.start import ClusterConfig, dask_cluster
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.store import MEGStore
from tests.flows.conftest import kill_cli_train_when, write_config

pytestmark = pytest.mark.slow


def _table_dirs(run_dir: Path, agent: str = "solver") -> list[Path]:
    return sorted((run_dir / "store").glob(f"*/{agent}"))


def _in_step_two(run_dir: Path, agent: str = "solver") -> Callable[[], bool]:
    """Whether `agent` consumed step 1 and step 2's rollout is under way."""

    def reached() -> bool:
        tables = _table_dirs(run_dir, agent)
        return (
            bool(tables)
            and (tables[0] / "consumed" / "1.json").exists()
            and any((tables[0] / "commits").glob("k000002-*"))
        )

    return reached


def _wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    context: Callable[[], str] = lambda: "",
) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{context()}")


def _train_while(killer: Callable[[], None], cfg: Path, run_dir: Path, scheduler: str) -> Any:
    """Train `cfg` on the cluster at `scheduler` while `killer` runs in a thread."""
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(run_dir),
            export_final=False,
            cluster=ClusterConfig(scheduler=scheduler),
        )
    )
    t.join(timeout=5)
    return out


def test_sigkill_then_resume_finishes_without_duplicates(
    tmp_path: Path, tiny_model: str, prefect_server: str, cluster: str
) -> None:
    cfg = write_config(
        tmp_path, tiny_model, backend="hf", steps=4, episodes_per_step=4, micro_batches=2
    )
    run_dir = tmp_path / "run"

    log = tmp_path / "run.log"
    # no cluster flags: the run is killed on the layout it chose (a rollout worker per agent)
    kill_cli_train_when(
        _in_step_two(run_dir), cfg, run_dir, prefect_server, log, "step 2", cluster=()
    )
    assert not (run_dir / "summary.json").exists()
    laid_out = re.search(r"layout: 2 agents, \d+ cores: 2 rollout worker", log.read_text())
    assert laid_out or len(os.sched_getaffinity(0)) < 2

    # the resume joins the session's cluster (a fresh one would only cost its start-up)
    where = ClusterConfig(scheduler=cluster)
    out = train(TrainParams(resume=str(run_dir), cluster=where, export_final=False))
    assert out["resumed_segments"] > 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    for agent in ("solver", "verifier"):
        table = store.table(agent)
        assert sorted(table.consumption_log()) == [0, 1, 2, 3]
        ids = table.read().sample_id
        assert len(ids) == 4 * 4 * (4 if agent == "solver" else 8)
        assert len(np.unique(ids)) == len(ids)
    assert out["consistency"]["violations"] == 0
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == out["run_id"]


def test_sigkill_of_a_one_node_run_resumes_from_the_store(
    tmp_path: Path, tiny_model: str, prefect_server: str, cluster: str
) -> None:
    """A one-agent, one-node job on its defaults: the spread layout, scores inside the
    generate tasks, a checkpoint only every 10 steps. Killed during step 2's rollout, it has
    no checkpoint yet: the resume rebuilds the trainer from the model, replays steps 0-1 from
    the store, and finishes with every step consumed once and a clean audit."""
    from bench.peer_job import AGENT, Job, meg_config

    cfg = meg_config(Job(4, 2, 8, 4), tiny_model, tmp_path, backend="hf")
    run_dir = tmp_path / "run"

    kill_cli_train_when(
        _in_step_two(run_dir, AGENT),
        cfg,
        run_dir,
        prefect_server,
        tmp_path / "run.log",
        "the run to reach step 2",
        cluster=(),  # its defaults, the layout included
    )
    assert "layout: one agent, on-policy" in (tmp_path / "run.log").read_text()
    from engines.training.checkpoint_index import committed_checkpoints
    from flows.runs.record import load_run

    assert committed_checkpoints(load_run(run_dir).ctx.checkpoint_root(AGENT)) == []

    where = ClusterConfig(scheduler=cluster)
    out = train(TrainParams(resume=str(run_dir), cluster=where, export_final=False))
    table = MEGStore.open(out["store_url"], out["run_id"], create=False).table(AGENT)
    assert sorted(table.consumption_log()) == [0, 1, 2, 3]
    ids = table.read().sample_id
    assert len(ids) == 4 * 4 * 2 and len(np.unique(ids)) == len(ids)
    assert out["consistency"]["violations"] == 0 and out["consistency"]["accounting_errors"] == 0
    scored = table.read()
    assert np.isfinite(np.asarray(scored.reward, dtype=float)).all()  # every row scored


def test_rollout_worker_killed_mid_step_is_retried(
    tmp_path: Path, tiny_model: str, prefect_server: str
) -> None:
    cfg = write_config(
        tmp_path, tiny_model, backend="hf", steps=3, episodes_per_step=4, micro_batches=2
    )
    run_dir = tmp_path / "run"
    with dask_cluster(ClusterConfig()) as workers:
        from distributed import Client

        killed: list[int] = []

        def killer() -> None:
            def at_step_one() -> bool:
                tables = _table_dirs(run_dir)
                return bool(tables) and any((tables[0] / "commits").glob("k000001-m0000-solve*"))

            _wait_for(at_step_one, 300, "step 1 rollout")
            with Client(workers.address) as client:
                pids = client.run(os.getpid, workers=None)
                info = client.scheduler_info(n_workers=-1)["workers"]
                addr = next(a for a, w in info.items() if w["name"] == workers.rollout[0])
                os.kill(pids[addr], signal.SIGKILL)
                killed.append(pids[addr])

        out = _train_while(killer, cfg, run_dir, workers.address)
    assert killed, "the rollout worker was never killed"
    assert out["steps"] == 3 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    assert sorted(store.table("verifier").consumption_log()) == [0, 1, 2]


def test_a_reward_failing_everywhere_stops_the_run_loudly_and_keeps_committed_rows(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """A reward that raises on every sample (a verdict whose target is no parent of the
    node) is a failed call per sample; past `run.scoring.max_failed_fraction` the run stops
    with the count and the reward's own message, the per-step Prefect task fails with it
    instead of waiting forever, and the rows generated before stay committed."""
    import yaml

    cfg = write_config(tmp_path, tiny_model, steps=2)
    data = yaml.safe_load(cfg.read_text())
    data["rewards"]["verify"]["params"]["target"] = "verify"  # not a parent of verify
    cfg.write_text(yaml.safe_dump(data))
    params = TrainParams(
        config=str(cfg),
        run_dir=str(tmp_path / "run"),
        export_final=False,
        cluster=ClusterConfig(scheduler=cluster),
    )
    with pytest.raises(Exception, match="failed their reward call") as err:
        train(params)
    assert "has no parent from node 'verify'" in str(err.value)  # the first failure's reason
    assert "max_failed_fraction = 0.2" in str(err.value)
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    store = MEGStore.open(rec["store_url"], rec["run_id"], create=False)
    verify = store.table("verifier").read(step=0)
    assert len(verify) > 0  # generated before the failure
    scored = [s for s in verify.score_status.tolist() if s]
    assert scored and all(s.startswith("failed: ValueError: verdict reward") for s in scored)


FLAKY_JUDGE = """
from workloads.rewards import reward, verdict


@reward(reads=lambda params: (params["target"],))
def flaky_verdict(sample, episode, task, **params):
    \"\"\"The verdict reward, except that the judge is down for the second sample of
    every group.\"\"\"
    if sample.id.endswith("/1"):
        raise ConnectionError("judge service unavailable")
    return verdict(sample, episode, task, **params)
"""


def test_a_reward_failing_on_some_samples_costs_those_samples_only(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """Half of the verifier's reward calls fail (under the 0.2 fraction of all samples):
    the run finishes, the failed samples are `failed` in the store and scored 0, and the
    summary counts them per agent."""
    import yaml

    cfg = write_config(tmp_path, tiny_model, steps=2)
    (tmp_path / "flaky_judge.py").write_text(FLAKY_JUDGE)
    data = yaml.safe_load(cfg.read_text())
    data["plugins"] = ["flaky_judge"]
    data["rewards"]["verify"]["fn"] = "flaky_judge:flaky_verdict"
    data["run"]["scoring"] = {"max_failed_fraction": 0.45}  # 16 of 48 per step
    cfg.write_text(yaml.safe_dump(data))
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(tmp_path / "run"),
            export_final=False,
            cluster=ClusterConfig(scheduler=cluster),
        )
    )
    assert out["steps"] == 2
    assert out["reward_failures"] == {"verifier": 2 * 4 * 4}  # steps × episodes × groups
    assert [r["failed_rewards"] for r in out["per_step"]] == [{"verifier": 16}] * 2
    verify = MEGStore.open(out["store_url"], out["run_id"], create=False).table("verifier").read()
    for sid, st, r in zip(verify.sample_id, verify.score_status, verify.reward, strict=True):
        if str(sid).endswith("/1"):
            assert st == "failed: ConnectionError: judge service unavailable" and r == 0.0
        else:
            assert st == "ok"
    assert out["consistency"]["violations"] == 0


def _pending_parts() -> dict[str, tuple[int | None, list[int]]]:
    """Run on a training worker: agent → (pending step, micro-batches accumulated so far)."""
    from tasks import worker

    out: dict[str, tuple[int | None, list[int]]] = {}
    for slots in list(worker._SLOTS.values()):
        for agent, trainer in list(slots._trainers.items()):
            if trainer.pending and not trainer.released:
                out[agent] = (trainer.pending_step, sorted(trainer.accumulated))
    return out


def test_training_worker_killed_between_micro_batches_costs_no_correctness(
    tmp_path: Path, tiny_model: str, prefect_server: str
) -> None:
    """SIGKILL of the training worker while a step holds some of its micro-batches but not
    all: the nanny restarts the worker, the rerun train tasks rebuild the trainer from its
    checkpoint and re-accumulate the lost micro-batches from the store, and the audit proves
    every step trained on exactly its rows, once (no partial, no double-counted batch)."""
    cfg = write_config(
        tmp_path, tiny_model, backend="hf", steps=4, episodes_per_step=6, micro_batches=3
    )
    run_dir = tmp_path / "run"
    with dask_cluster(ClusterConfig()) as workers:
        from distributed import Client

        seen: list[dict[str, tuple[int | None, list[int]]]] = []

        def killer() -> None:
            with Client(workers.address) as client:
                info = client.scheduler_info(n_workers=-1)["workers"]
                addr = next(a for a, w in info.items() if w["name"] == workers.train[0])
                end = time.time() + 300
                while time.time() < end and not seen:
                    try:
                        parts = client.run(_pending_parts, workers=[addr])[addr]
                    except Exception:  # the worker is busy starting up: try again
                        parts = {}
                    partial = {
                        a: p
                        for a, p in parts.items()
                        if p[0] is not None and p[0] >= 1 and 0 < len(p[1]) < 3
                    }
                    if partial:
                        pid = client.run(os.getpid, workers=[addr])[addr]
                        os.kill(pid, signal.SIGKILL)
                        seen.append(partial)
                    time.sleep(0.05)

        out = _train_while(killer, cfg, run_dir, workers.address)
    assert seen, "the training worker was never caught between two micro-batches"
    step, parts = next(iter(seen[0].values()))
    assert step is not None and 0 < len(parts) < 3  # killed mid-step: part of the batch held
    assert out["steps"] == 4
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    assert audit.steps_checked == 2 * 4  # both agents, every step, each checked against rows
    for agent, per_episode in (("solver", 4), ("verifier", 8)):
        log = store.table(agent).consumption_log()
        assert sorted(log) == [0, 1, 2, 3]
        assert [r["extra"]["version_after"] for r in log.values()] == [1, 2, 3, 4]
        for rec in log.values():  # every micro-batch of the step, each once
            assert [j for j, _, _ in rec["extra"]["trained"]] == [0, 1, 2]
            assert rec["extra"]["rows"] == 6 * per_episode
