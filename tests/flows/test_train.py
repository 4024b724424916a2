"""The train flow end to end on real components: modes, consistency, overlap, artifacts."""

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
from storage.store import MEGStore
from tests.flows.conftest import write_config

pytestmark = pytest.mark.slow


def run_mode(tmp: Path, model: str, cluster: str, mode: str, **kw: Any) -> dict[str, Any]:
    cfg = write_config(tmp, model, **kw.pop("run", {}))
    params = TrainParams(
        config=str(cfg),
        mode=mode,
        run_dir=str(tmp / f"run-{mode}"),
        cluster=ClusterConfig(scheduler=cluster),
        export_final=False,
        **kw,
    )
    return train(params)


def intervals(run_dir: str, phases: tuple[str, ...]) -> list[tuple[float, float, int]]:
    rows = json.loads((Path(run_dir) / "timeline.json").read_text())
    return [(r["start"], r["end"], r["step"]) for r in rows if r["phase"] in phases]


def overlaps(a: list[tuple[float, float, int]], b: list[tuple[float, float, int]]) -> int:
    return sum(1 for s1, e1, _ in a for s2, e2, _ in b if s1 < e2 and s2 < e1)


@pytest.mark.parametrize(("mode", "staleness"), [("sync", 0), ("flex", 0), ("async", 1)])
def test_modes_are_consistent_from_the_store_alone(
    tmp_path: Path, tiny_model: str, cluster: str, mode: str, staleness: int
) -> None:
    out = run_mode(tmp_path, tiny_model, cluster, mode, staleness=staleness)
    assert out["mode"] == mode and out["steps"] == 3
    # 4 episodes × (4 solver + 8 verifier samples) × 3 steps
    assert out["consistency"]["rows_checked"] == 3 * 4 * 12
    assert out["consistency"]["violations"] == 0
    # flex and sync never lag; async(1) may lag by one version. Whether a row here is one
    # version old is a race (the verifier's and the solver's trainings may publish before
    # the next rollout starts); that async does use its slack is asserted where the task
    # graph forces it (tests/flows/test_lora.py, a team-rewarded root)
    assert out["consistency"]["max_lag"] <= staleness
    if staleness == 0:
        assert out["consistency"]["max_lag"] == 0
    # the audit re-reads the store: the same verdict without the orchestrator's word
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.rows_checked, audit.violations) == (144, 0)
    # every step trained on exactly its rows, as the trainers' own counters recorded them
    assert (audit.accounting_errors, audit.steps_unverified, audit.steps_checked) == (0, 0, 6)
    for agent in ("solver", "verifier"):
        log = store.table(agent).consumption_log()
        assert sorted(log) == [0, 1, 2]
        assert [r["extra"]["version_after"] for r in log.values()] == [1, 2, 3]
        ckpts = Path(out["store_url"].removeprefix("file://")) / out["run_id"] / "_checkpoints"
        # every step checkpoints; only the newest 2 (the default) are kept
        assert sorted(p.name for p in (ckpts / agent).iterdir()) == ["v000002", "v000003"]
        ids = store.table(agent).read().sample_id
        assert len(np.unique(ids)) == len(ids)  # no duplicate rows
    for name in ("reward_curve.png", "timeline.png", "summary.json", "run.json", "meg.mmd"):
        assert (Path(out["run_dir"]) / name).is_file(), name


def test_flex_overlaps_rollout_and_training_and_sync_does_not(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    run = {"steps": 3, "episodes_per_step": 8, "micro_batches": 4}
    sync = run_mode(tmp_path / "s", tiny_model, cluster, "sync", run=run)
    flex = run_mode(tmp_path / "f", tiny_model, cluster, "flex", run=run)
    gen_s, train_s = (
        intervals(sync["run_dir"], p)
        for p in (("generate",), ("train_micro_batch", "optimizer_step"))
    )
    gen_f, train_f = (
        intervals(flex["run_dir"], p)
        for p in (("generate",), ("train_micro_batch", "optimizer_step"))
    )
    assert len(gen_s) == len(gen_f) == 3 * 4 * 2
    assert overlaps(gen_s, train_s) == 0  # the barrier: rollout and training take turns
    assert overlaps(gen_f, train_f) > 0  # flex: training of one micro-batch or agent
    # runs while another is still generating


def test_fanout_sample_tree_matches_the_meg_expansion(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """Five agents, a per-sample fan-out and `best` aggregates, through Prefect tasks: every
    stored sample is exactly one the MEG's expansion predicts, with lineage-correct parents.
    Five agents on two training slots also exercises the slot manager's swaps. Score groups:
    a worker (scored on its own answer) trains before its episode's aggregate is generated;
    the planner (team reward) never does."""
    from meg import expand_episode, load_meg

    cfg = write_config(
        tmp_path, tiny_model, workload="fanout", steps=2, episodes_per_step=4, micro_batches=2
    )
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(tmp_path / "run"),
            export_final=False,
            cluster=ClusterConfig(scheduler=cluster),
        )
    )
    spec = load_meg(cfg, check_models=False)
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    rows = {n: store.table(spec.nodes[n].agent).read(node=n) for n in spec.nodes}
    for episode in ("k0e0", "k0e1", "k1e3"):
        exp = expand_episode(spec, episode)
        lineage = {s.id: dict(s.lineage) for ss in exp.samples.values() for s in ss}
        for node, batch in rows.items():
            mine = batch.episode == episode
            assert sorted(batch.sample_id[mine]) == sorted(s.id for s in exp.samples[node])
            for sid, parents in zip(batch.sample_id[mine], batch.parent_ids[mine], strict=True):
                ps = [p for p in str(parents).split(",") if p]
                assert len(ps) == len(spec.nodes[node].inputs)  # per_sample / best: one each
                for p in ps:  # every parent shares this sample's lineage
                    shared = lineage[p].keys() & lineage[str(sid)].keys()
                    assert all(lineage[p][n] == lineage[str(sid)][n] for n in shared)
    assert out["consistency"]["violations"] == 0
    assert sorted(store.agents()) == sorted(spec.agents)

    tl = json.loads((Path(out["run_dir"]) / "timeline.json").read_text())
    at = {(r["phase"], r["agent"], r["step"], r["micro_batch"]): r for r in tl}
    mbs = [(k, j) for k in range(2) for j in range(2)]
    agg_end = {kj: at[("generate", "aggregator", *kj)]["end"] for kj in mbs}
    early = [
        (a, kj)
        for a in ("short", "medium", "long")
        for kj in mbs
        if at[("train_micro_batch", a, *kj)]["start"] < agg_end[kj]
    ]
    assert early, "no worker trained before its micro-batch's aggregate was generated"
    assert all(at[("train_micro_batch", "planner", *kj)]["start"] >= agg_end[kj] for kj in mbs)


def test_runs_publish_prefect_artifacts(tmp_path: Path, tiny_model: str, cluster: str) -> None:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    run_mode(tmp_path, tiny_model, cluster, "flex", steps=2)

    wanted = [
        f"math-chain-flex-{s}" for s in ("metrics", "reward-curve", "timeline", "meg", "summary")
    ] + ["flexmarl-progress"]

    async def artifacts() -> tuple[list[Any], dict[Any, Any]]:
        """The artifacts, and each progress artifact's flow run → the flow run above it."""
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=wanted))
            )
            parents = {}
            for a in arts:
                if a.key == wanted[-1]:  # made in the pipeline's subflow run
                    sub = await client.read_flow_run(a.flow_run_id)
                    if sub.parent_task_run_id is not None:  # other tests' runs share the server
                        task = await client.read_task_run(sub.parent_task_run_id)
                        parents[a.flow_run_id] = task.flow_run_id
            return arts, parents

    arts, parents = asyncio.run(artifacts())
    assert {a.key for a in arts if a.key} == set(wanted)
    # this run's progress bar ends full, though its updates are throttled
    summary = max((a for a in arts if a.key == wanted[-2]), key=lambda a: a.created)
    ours = [a.data for a in arts if parents.get(a.flow_run_id) == summary.flow_run_id]
    assert ours == [100]


def test_two_step_run_on_the_tied_qwen2_model(
    tmp_path: Path, cluster: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The family conformance suite's end-to-end leg: math-chain's two agents on a tiny
    Qwen2 (tied embeddings, q/k/v biases, 151,936-entry vocabulary) through a real run —
    vLLM rollouts, weight publication to the hosts, training, checkpoints, the export."""
    from transformers import AutoModelForCausalLM

    from workloads.tiny_model import build_tiny_model

    model = str(build_tiny_model(tmp_path_factory.mktemp("qwen2") / "m", family="qwen2"))
    cfg = write_config(tmp_path, model, steps=2)
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(tmp_path / "run"),
            cluster=ClusterConfig(scheduler=cluster),
        )
    )
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.accounting_errors, audit.steps_checked) == (0, 4)
    for agent in ("solver", "verifier"):  # step 1 sampled with version 1: publication worked
        assert sorted(set(store.table(agent).read(step=1).policy_version.tolist())) == [1]
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / agent)
        assert exported.config.vocab_size == 151936 and exported.config.tie_word_embeddings
        emb = exported.get_input_embeddings().weight
        assert exported.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
        log = store.table(agent).consumption_log()
        assert [(r["extra"]["version_after"], r["extra"]["skipped"]) for r in log.values()] == [
            (1, False),
            (2, False),
        ]
        assert (
            json.loads((tmp_path / "run" / "final" / agent / "flexmarl.json").read_text())[
                "version"
            ]
            == 2
        )


@pytest.mark.parametrize(("mode", "staleness"), [("flex", 0), ("async", 1)])
def test_zero_advantage_skipping_in_a_real_run(
    tmp_path: Path, tiny_model: str, cluster: str, mode: str, staleness: int
) -> None:
    """`loss.skip_zero_advantage` in flex and async: the audit is clean and every step's
    consumption record says which fraction of its rows had advantage 0 (and were skipped)."""
    import yaml

    cfg = write_config(tmp_path, tiny_model)
    data = yaml.safe_load(cfg.read_text())
    for agent in data["agents"].values():
        agent["loss"] = {**agent.get("loss", {}), "skip_zero_advantage": True}
    cfg.write_text(yaml.safe_dump(data))
    params = TrainParams(
        config=str(cfg),
        mode=mode,
        staleness=staleness,
        run_dir=str(tmp_path / "run"),
        cluster=ClusterConfig(scheduler=cluster),
        export_final=False,
    )
    out = train(params)
    assert out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    assert audit_consistency(store).accounting_errors == 0
    fractions = []
    for agent in ("solver", "verifier"):
        for step, record in store.table(agent).consumption_log().items():
            rows = store.table(agent).read(step=step)
            zero = float(np.mean(rows.advantage == 0))
            assert record["extra"]["metrics"]["zero_adv_skipped_frac"] == pytest.approx(zero)
            fractions.append(zero)
    assert any(f > 0 for f in fractions)  # a tiny random policy: many groups agree


def test_a_config_at_the_limits_passes_the_checks_and_runs(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """Every size at the largest value the checks accept (or unbounded, like max_tokens on
    the last node), in one real run: what passes `check` must not fail at run time."""
    from engines.training.checkpoint_index import latest_checkpoint
    from flows.train import check
    from meg.limits import MAX_SEED, MAX_TIMEOUT_S, MAX_WINDOW

    cfg = write_config(tmp_path, tiny_model, steps=2, episodes_per_step=2, micro_batches=1)
    data = yaml.safe_load(cfg.read_text())
    data["agents"]["verifier"]["sampling"]["max_tokens"] = 10**12  # clamped by the engine
    data["run"] |= {
        "window": MAX_WINDOW,
        "seed": MAX_SEED,
        "mode": "async",
        "staleness": 10**6,
        "checkpoint_every": 10**9,  # the last step is checkpointed all the same
        "keep_checkpoints": 10**9,
        "scoring": {"timeout_s": MAX_TIMEOUT_S, "min_samples": 10**12},
    }
    cfg.write_text(yaml.safe_dump(data))
    params = TrainParams(
        config=str(cfg),
        run_dir=str(tmp_path / "run"),
        cluster=ClusterConfig(scheduler=cluster),
        export_final=False,
    )
    check(params)
    out = train(params)
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    rows = store.table("verifier").read()
    total = np.diff(rows.prompt_offsets) + np.diff(rows.response_offsets)
    assert len(total) and total.max() <= 512  # prompt + response within the context
    assert (np.diff(rows.response_offsets) > 32).any()  # not cut at the default max_tokens
    assert latest_checkpoint(f"{out['store_url']}/{out['run_id']}/_checkpoints/verifier")


def _run_hosts(run_id: str) -> dict[str, tuple[str, bool, int]]:
    """This worker's hosts of `run_id`: key → (backend, adopted, loaded version)."""
    from engines.rollout import hosts

    return {
        k: (h.backend_name, h.adopted, h.version)
        for k, h in hosts._HOSTS.items()
        if k.startswith(f"{run_id}/")
    }


def _samples(out: dict[str, Any], agent: str) -> tuple[list[Any], np.ndarray]:
    """(response ids, behaviour logprobs) of every row of `agent`, in sample-id order."""
    rows = MEGStore.open(out["store_url"], out["run_id"], create=False).table(agent).read()
    order = np.argsort(rows.sample_id, kind="stable")
    offsets = rows.response_offsets
    ids = [rows.response_ids[offsets[i] : offsets[i + 1]].tolist() for i in order]
    lps = np.concatenate([rows.logprobs[offsets[i] : offsets[i + 1]] for i in order])
    return ids, lps


def test_the_next_run_reuses_the_engines_reset_to_the_model(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """A long-lived cluster hands a finished run's engines to the next run of the same
    models (tasks.worker.hand_over_hosts), reset to the model directory's weights: the
    second run samples exactly what the first did (same seed), although the engines it gets
    held the first run's trained weights."""
    from distributed import Client

    first = run_mode(tmp_path / "a", tiny_model, cluster, "sync")
    second = run_mode(tmp_path / "b", tiny_model, cluster, "sync")
    with Client(cluster) as client:
        seen = client.run(_run_hosts, second["run_id"])
        old = client.run(_run_hosts, first["run_id"])
    hosts = {k: v for per_worker in seen.values() for k, v in per_worker.items()}
    assert set(hosts) == {f"{second['run_id']}/{a}" for a in ("solver", "verifier")}
    assert all(adopted for _, adopted, _ in hosts.values())  # no engine was built again
    # and they served the run on: its last step (2) sampled with the weights of version 2
    assert all(version == 2 for _, _, version in hosts.values())
    assert not any(old.values())  # the first run's keys are gone
    for agent in ("solver", "verifier"):
        ids_a, lps_a = _samples(first, agent)
        ids_b, lps_b = _samples(second, agent)
        assert ids_a == ids_b, agent
        np.testing.assert_allclose(lps_a, lps_b, rtol=0, atol=1e-5, err_msg=agent)
