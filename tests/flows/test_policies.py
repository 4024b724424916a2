"""Rollout and selection policies in real runs (flex and async): APRIL carries unfinished
samples into the next step and the audit proves every token's version from the store alone;
GRESO skips prompts whose history taught nothing and the store holds exactly the rest; a
run killed with partial samples in the store resumes and continues them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.schema import SegmentKey
from storage.store import MEGStore
from tests.flows.conftest import ONE_WORKER, kill_cli_train_when, run_store, write_config

pytestmark = pytest.mark.slow

MAX_CARRY = 1
APRIL = {"policy": "april", "over_provision": 1.0, "max_carry": MAX_CARRY}


def policy_config(
    tmp: Path, model: str, workload: str, *, backend: str | None = None, **run: Any
) -> Path:
    """`workload` on `model`, 4 steps × 4 episodes in 2 micro-batches, six tasks (prompts
    recur, so selection has a history), with the given `run:` entries."""
    cfg = write_config(
        tmp, model, workload, backend=backend, steps=4, episodes_per_step=4, micro_batches=2
    )
    data = yaml.safe_load(cfg.read_text())
    data["dataset"]["train_size"] = 6
    data["run"] |= run
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def run(cfg: Path, run_dir: Path, cluster: str, mode: str) -> dict[str, Any]:
    return train(
        TrainParams(
            config=str(cfg),
            mode=mode,
            staleness=1 if mode == "async" else 0,
            run_dir=str(run_dir),
            cluster=ClusterConfig(scheduler=cluster),
            export_final=False,
        )
    )


def carries_continue(store: MEGStore, agent: str, node: str, last_step: int) -> int:
    """Every sample cut at (k, j) before the last step is continued at (k+1, j) (trained or
    carried again) with its prefix unchanged; returns how many partial samples were checked."""
    table = store.table(agent)
    checked = 0
    for info in table.segments(kind="carry"):
        k, j = info.step, info.micro_batch
        carried = table.read_carry(SegmentKey(k, j, node))
        if carried is None or k >= last_step:
            continue
        after = table.read(step=k + 1, micro_batch=j, node=node)
        again = table.read_carry(SegmentKey(k + 1, j, node))
        rows = {str(s): (after, i) for i, s in enumerate(after.sample_id)}
        if again is not None:
            rows |= {str(s): (again, i) for i, s in enumerate(again.sample_id)}
        for i, sid in enumerate(carried.sample_id):
            assert str(sid) in rows, f"{sid} cut at step {k} was never continued"
            batch, r = rows[str(sid)]
            prefix = carried.response(i)
            assert np.array_equal(batch.response(r)[: len(prefix)], prefix)
            assert np.array_equal(batch.token_version(r)[: len(prefix)], carried.token_version(i))
            checked += str(carried.finish_reason[i]) == "partial"
    return checked


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_april_carries_unfinished_samples_and_the_audit_proves_every_token(
    tmp_path: Path, longtail_model: str, cluster: str, mode: str
) -> None:
    cfg = policy_config(tmp_path, longtail_model, "longtail", rollout=APRIL)
    out = run(cfg, tmp_path / "run", cluster, mode)
    assert out["steps"] == 4 and out["consistency"]["violations"] == 0
    totals = out["rollout"]
    assert totals["offpolicy_tokens"] > 0 and 0 < totals["offpolicy_frac"] < 1
    assert sum(r["carried_tokens"] for r in out["per_step"]) > 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    lag = 1 if mode == "async" else 0
    assert 1 <= audit.max_lag <= lag + MAX_CARRY  # carried tokens are older
    assert carries_continue(store, "counter", "count", 3) > 0
    # a continued sample holds tokens of two versions: the cut prefix, then the new policy
    rows = store.table("counter").read()
    mixed = [i for i in range(len(rows)) if len(set(rows.token_version(i).tolist())) > 1]
    assert mixed
    carry_nodes = {info.node for info in store.table("counter").segments(kind="carry")}
    assert carry_nodes == {"count"} and not store.table("checker").segments(kind="carry")
    # nothing below the root sees a cut episode: every checker row's parent was trained
    counts = set(map(str, rows.sample_id))
    checks = store.table("checker").read()
    assert {p for ids in checks.parent_ids for p in str(ids).split(",")} <= counts


def test_april_on_a_one_node_meg_scores_inside_its_generate_task(
    tmp_path: Path, longtail_model: str, cluster: str
) -> None:
    """The counter alone (a one-node MEG): its generate task both cuts (APRIL) and scores
    (`fused_scores`). Every trained row is scored, carried samples are continued, and the
    audit proves every token's version."""
    cfg = policy_config(tmp_path, longtail_model, "longtail", rollout=APRIL)
    data = yaml.safe_load(cfg.read_text())
    for section, key in (("agents", "checker"), ("nodes", "check"), ("rewards", "check")):
        del data[section][key]
    cfg.write_text(yaml.safe_dump(data))
    out = run(cfg, tmp_path / "run", cluster, "flex")
    assert out["steps"] == 4 and out["consistency"]["violations"] == 0
    assert sum(r["carried_tokens"] for r in out["per_step"]) > 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    assert carries_continue(store, "counter", "count", 3) > 0
    rows = store.table("counter").read()
    assert np.isfinite(np.asarray(rows.reward, dtype=float)).all()  # every trained row scored
    timeline = json.loads((tmp_path / "run" / "timeline.json").read_text())
    gens = {(t["step"], t["micro_batch"]): t for t in timeline if t["phase"] == "generate"}
    scores = [t for t in timeline if t["phase"] == "score"]
    assert len(scores) == len(gens) == 4 * 2
    assert all(s["worker"] == gens[(s["step"], s["micro_batch"])]["worker"] for s in scores)


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_greso_skips_prompts_that_taught_nothing(
    tmp_path: Path, tiny_model: str, cluster: str, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seed-0 tiny model almost never answers right: most groups get one reward, so
    GRESO skips prompts once their history exists (steps >= window), and the store holds
    exactly the episodes that were rolled out."""
    from flows.cli.main import main as cli

    cfg = policy_config(tmp_path, tiny_model, "math-chain", select={"policy": "greso"})
    args = ["train", str(cfg), "--run-dir", str(tmp_path / "run"), "--scheduler", cluster]
    args += ["--mode", mode, "--staleness", "1" if mode == "async" else "0", "--no-export-final"]
    assert cli([*args, "--summary-json", str(tmp_path / "summary.json")]) == 0
    out = json.loads((tmp_path / "summary.json").read_text())
    assert out["consistency"]["violations"] == 0
    n = out["rollout"]["skipped_prompts"]
    assert f"{n} prompts skipped" in capsys.readouterr().out  # the CLI's closing lines say it
    skipped = [r["skipped_prompts"] for r in out["per_step"]]
    assert skipped[:2] == [0, 0]  # no history yet before step `window` (2)
    assert sum(skipped) == out["rollout"]["skipped_prompts"] > 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    assert audit_consistency(store).accounting_errors == 0
    solver = store.table("solver")
    for k, n_skipped in enumerate(skipped):
        episodes = set(map(str, solver.read(step=k).episode))
        assert len(episodes) == 4 - n_skipped  # 4 planned per step
        assert len(solver.read(step=k)) == 4 * len(episodes)  # n = 4 samples each
    assert sorted(solver.consumption_log()) == [0, 1, 2, 3]


def test_april_run_killed_with_partial_samples_resumes_and_continues_them(
    tmp_path: Path, longtail_model: str, prefect_server: str, cluster: str
) -> None:
    """SIGKILL of the whole run while the store holds partial samples that the next step has
    not continued yet; `--resume` continues them (not lost, not restarted), and the audit is
    clean with no duplicate rows."""
    cfg = policy_config(
        tmp_path,
        longtail_model,
        "longtail",
        backend="hf",
        rollout=APRIL,
        select={"policy": "greso"},
    )
    run_dir = tmp_path / "run"
    pending: list[tuple[int, int, list[str]]] = []

    def partial_not_continued() -> bool:
        store = run_store(run_dir)
        if store is None:  # the run has not made its record or store yet
            return False
        table = store.table("counter")
        for info in table.segments(kind="carry"):
            k, j = info.step, info.micro_batch
            if k >= 3 or table.has_segment(SegmentKey(k + 1, j, "count")):
                continue
            carried = table.read_carry(SegmentKey(k, j, "count"))
            if carried is None:
                continue
            part = [
                str(s)
                for s, f in zip(carried.sample_id, carried.finish_reason, strict=True)
                if f == "partial"
            ]
            if part:
                pending.append((k, j, part))
                return True
        return False

    kill_cli_train_when(
        partial_not_continued,
        cfg,
        run_dir,
        prefect_server,
        tmp_path / "run.log",
        "a partial sample committed and not yet continued",
        cluster=ONE_WORKER,  # one colocated worker: what is tested is the resume
    )
    assert not (run_dir / "summary.json").exists()
    # the resume joins the session's cluster (a fresh one would only cost its start-up)
    where = ClusterConfig(scheduler=cluster)
    out = train(TrainParams(resume=str(run_dir), cluster=where, export_final=False))
    assert out["steps"] == 4 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors) == (0, 0)
    k, j, partial = pending[0]
    table = store.table("counter")
    carried = table.read_carry(SegmentKey(k, j, "count"))
    assert carried is not None
    continued = table.read(step=k + 1, micro_batch=j, node="count")
    again = table.read_carry(SegmentKey(k + 1, j, "count"))
    after = set(map(str, continued.sample_id)) | set(
        map(str, again.sample_id if again is not None else [])
    )
    assert set(partial) <= after  # the samples cut before the kill went on after it
    assert carries_continue(store, "counter", "count", 3) > 0
    for agent in ("counter", "checker"):
        ids = store.table(agent).read().sample_id
        assert len(np.unique(ids)) == len(ids)  # no sample trained twice
        assert sorted(store.table(agent).consumption_log()) == [0, 1, 2, 3]
