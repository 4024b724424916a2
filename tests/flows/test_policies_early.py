"""The single-sample rollout policies, SERA and EchoRL in real runs (flex and async, a real
cluster and Prefect server, vLLM): `rollverify` stops samples whose reward is decided,
`darts` trains each group's shortest `n` of more, `sera` gives a prompt several episodes in
one advantage group, `loss.echo` trains the all-right groups' clips; every run audits clean,
and a run killed mid-way resumes to the same clean end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.longtail import logprob_gap
from storage.audit import audit_consistency
from storage.store import MEGStore
from tests.flows.conftest import ONE_WORKER, kill_cli_train_when, run_store
from tests.flows.test_policies import policy_config, run
from workloads.datasets import TaskItem
from workloads.longtail import sequence_wrong_already

pytestmark = pytest.mark.slow

# `success: 0`: with this short warm start the counter gets every list wrong, so every group
# has one reward (0) and, at this bar, is "all right": the clips' mechanics are what runs
# here; what echoing does to the reward is the long-tail benchmark's (bench/longtail.py)
ECHO = {"coef": 0.05, "delimiter": " ", "success": 0.0}


def clean(out: dict, steps: tuple[int, ...] = (4,)) -> MEGStore:
    """The run's own audit and a fresh one from the store are clean; `steps`: how many this
    invocation may have run."""
    assert out["steps"] in steps and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    return store


def with_echo(cfg: Path) -> Path:
    data = yaml.safe_load(cfg.read_text())
    data["agents"]["counter"]["loss"] = {"echo": ECHO}
    cfg.write_text(yaml.safe_dump(data))
    return cfg


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_rollverify_stops_samples_already_wrong_and_trains_them_as_they_are(
    tmp_path: Path,
    longtail_model: str,
    cluster: str,
    mode: str,
) -> None:
    cfg = policy_config(tmp_path, longtail_model, "longtail", rollout={"policy": "rollverify"})
    store = clean(run(cfg, tmp_path / "run", cluster, mode))
    rows = store.table("counter").read()
    verified = np.flatnonzero(rows.finish_reason == "verified")
    assert len(verified) > 0, "no sample was stopped"
    tok = __import__("transformers").AutoTokenizer.from_pretrained(longtail_model)
    data = yaml.safe_load(cfg.read_text())
    for i in verified:  # stopped because already wrong, so scored 0 and trained
        assert rows.reward[i] == 0.0 and np.isfinite(rows.advantage[i])
        text = tok.decode(rows.response(i).tolist(), skip_special_tokens=True)
        question = rows.prompt(i)  # the task's answer from the prompt's "list a..b"
        q = tok.decode(question.tolist())
        lo, hi = (int(x) for x in q.split("list ")[1].split("\n")[0].split(".."))
        answer = " ".join(str(x) for x in range(lo, hi + 1))
        assert sequence_wrong_already(text, TaskItem("t", "q", answer))
    assert data["agents"]["checker"]  # the checker reads the stopped lists as they are
    assert not (store.table("checker").read().finish_reason == "verified").any()


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_darts_trains_each_groups_shortest_n_and_stores_nothing_else(
    tmp_path: Path,
    longtail_model: str,
    cluster: str,
    mode: str,
) -> None:
    darts = {"policy": "darts", "over_sample": 1.0}
    cfg = policy_config(tmp_path, longtail_model, "longtail", rollout=darts)
    store = clean(run(cfg, tmp_path / "run", cluster, mode))
    rows = store.table("counter").read()
    groups, counts = np.unique(rows.group_id, return_counts=True)
    assert len(groups) == 4 * 4 and set(counts) == {4}  # n = 4 per group, as planned
    assert not (rows.finish_reason == "dropped").any()
    ids = [str(s).rsplit("/", 1)[1] for s in rows.sample_id]
    assert set(ids) == {"0", "1", "2", "3"}  # the kept ones are the node's samples 0..n-1


def sera_groups(store: MEGStore, per_mb: int) -> dict[tuple[int, int, str], list[int]]:
    """The counter's rows per (step, micro-batch, prompt): one SERA group each (episode
    `k{step}e{i}` is in micro-batch i // per_mb)."""
    rows = store.table("counter").read()
    groups: dict[tuple[int, int, str], list[int]] = {}
    for i in range(len(rows)):
        mb = int(str(rows.episode[i]).split("e")[1]) // per_mb
        key = (int(rows.step[i]), mb, rows.prompt(i).tobytes().hex())
        groups.setdefault(key, []).append(i)
    return groups


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_sera_gives_a_prompt_several_episodes_in_one_group(
    tmp_path: Path, longtail_model: str, cluster: str, mode: str
) -> None:
    """8 episodes of n = 2 per step, 2 micro-batches: each micro-batch's 4 episodes go to its
    2 planned prompts by their estimated success rate. A prompt's rows are one MaxRL group
    whose advantages are scaled by base/k for its k episodes; what the run reports as episodes
    beyond the mean is what the store holds."""
    cfg = policy_config(tmp_path, longtail_model, "longtail", select={"policy": "sera"})
    data = yaml.safe_load(cfg.read_text())
    data["run"]["episodes_per_step"] = 8
    data["nodes"]["count"]["n"] = 2
    data["agents"]["counter"]["loss"] = {"advantage": "maxrl"}
    cfg.write_text(yaml.safe_dump(data))
    out = run(cfg, tmp_path / "run", cluster, mode)
    store = clean(out)
    rows = store.table("counter").read()
    beyond = {r["step"]: 0 for r in out["per_step"]}
    prompts = {r["step"]: 0 for r in out["per_step"]}
    for (step, _, _), idx in sera_groups(store, 4).items():
        episodes = len(set(rows.episode[idx].tolist()))
        beyond[step] += max(episodes - 2, 0)
        prompts[step] += 1
        r = rows.reward[idx].astype(np.float64)
        want = (r - r.mean()) / (abs(r.mean()) + 1e-6) * 2 / episodes  # base 2 / k
        assert np.allclose(rows.advantage[idx], want, rtol=1e-4, atol=1e-5)
    for r in out["per_step"]:
        assert len(set(rows.episode[rows.step == r["step"]].tolist())) == 8
        # a prompt drawn twice into one micro-batch is one group, its shares added up
        fits = (r["repeated_prompts"] == beyond[r["step"]]) if prompts[r["step"]] == 4 else True
        assert fits and r["repeated_prompts"] <= beyond[r["step"]]
    reported = sum(r["repeated_prompts"] for r in out["per_step"])
    assert out["rollout"]["repeated_prompts"] == reported


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_srt_stores_the_policys_own_logprobs(
    tmp_path: Path, longtail_model: str, cluster: str, mode: str
) -> None:
    """Speculative rollout in a real run (hf backend): every counter sample of version 0
    carries, token for token, the logprob the warm-started model gives it under teacher
    forcing — drafts change how many forward passes decode it, never what is sampled."""
    srt = {"policy": "srt", "draft": 4}
    cfg = policy_config(tmp_path, longtail_model, "longtail", backend="hf", rollout=srt)
    rows = clean(run(cfg, tmp_path / "run", cluster, mode)).table("counter").read()
    assert (rows.policy_version == 0).sum() >= 8  # step 0's samples, of the model as built
    assert logprob_gap(longtail_model, rows) < 1e-4


SPARSE = {"policy": "sparse", "budget": 12, "sinks": 2, "window": 4, "every": 2}


def corrected(cfg: Path) -> Path:
    """Every agent's loss naming Sparse-RL's correction itself (a run gives it to an agent
    that names no anchor)."""
    data = yaml.safe_load(cfg.read_text())
    for agent in data["agents"].values():
        agent.setdefault("loss", {})["old_logprobs"] = "sparse_rl"
    cfg.write_text(yaml.safe_dump(data))
    return cfg


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_sparse_stores_the_sparse_sampler_s_logprobs_and_corrects_them(
    tmp_path: Path, longtail_model: str, cluster: str, mode: str
) -> None:
    """Sparse-KV rollouts in a real run (hf backend, a 12-entry budget that long lists
    outgrow): the audit is clean, the stored logprobs are the sparse sampler's (away from
    the dense model's on the samples the budget cut), and every training step weighed its
    tokens with Sparse-RL's correction — which the run's settings gave the agents (the MEG
    names no anchor; the resume test below names it)."""
    cfg = policy_config(tmp_path, longtail_model, "longtail", backend="hf", rollout=SPARSE)
    store = clean(run(cfg, tmp_path / "run", cluster, mode))
    sources = json.loads((tmp_path / "run" / "run.json").read_text())["sources"]
    assert sources["agents.counter.loss.old_logprobs"] == "policy"
    rows = store.table("counter").read()
    assert (rows.policy_version == 0).sum() >= 8
    assert logprob_gap(longtail_model, rows) > 1e-3  # not the dense policy's logprobs
    for agent in ("counter", "checker"):
        for rec in store.table(agent).consumption_log().values():
            assert 0.0 <= rec["extra"]["metrics"]["is_weight_mean"] <= 1.5


def test_echo_trains_the_clips_of_all_right_groups(
    tmp_path: Path,
    longtail_model: str,
    cluster: str,
) -> None:
    cfg = with_echo(policy_config(tmp_path, longtail_model, "longtail"))
    store = clean(run(cfg, tmp_path / "run", cluster, "flex"))
    log = store.table("counter").consumption_log()
    fracs = [rec["extra"]["metrics"].get("echo_frac", -1.0) for rec in log.values()]
    assert all(0 <= f < 1 for f in fracs) and max(fracs) > 0
    assert all(
        "echo_frac" not in r["extra"]["metrics"]
        for r in store.table("checker").consumption_log().values()
    )


def test_the_bandit_rolls_out_as_many_episodes_as_planned(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """A contextual bandit run: every step rolls out its planned 4 episodes (a replayed
    prompt takes a planned one's place, never adds one), what it reports replayed is what
    the store holds, and the audit is clean."""
    cfg = policy_config(tmp_path, tiny_model, "math-chain", select={"policy": "bandit"})
    out = run(cfg, tmp_path / "run", cluster, "flex")
    store = clean(out)
    solver = store.table("solver")
    for r in out["per_step"]:
        assert len(set(map(str, solver.read(step=r["step"]).episode))) == 4
        assert r["replayed_prompts"] == r["skipped_prompts"]  # one in, one out
    assert out["rollout"]["replayed_prompts"] == sum(r["replayed_prompts"] for r in out["per_step"])


@pytest.mark.parametrize(
    "policies",
    [
        {"rollout": {"policy": "rollverify"}, "select": {"policy": "bandit"}},
        {"rollout": {"policy": "darts"}},
        {"rollout": {"policy": "srt"}, "select": {"policy": "sera"}},
        {"rollout": SPARSE},
    ],
    ids=["rollverify-bandit-echo", "darts-echo", "srt-sera-echo", "sparse-echo"],
)
def test_a_killed_run_resumes_clean(
    tmp_path: Path, longtail_model: str, prefect_server: str, cluster: str, policies: dict
) -> None:
    """SIGKILL of the whole run once step 1 is trained; `--resume` finishes it with a clean
    audit, every sample once, and the policies still acting (stopped or kept samples).

    Every rollout policy (rollverify, darts, srt, sparse) and selection policy (bandit,
    sera) is killed and resumed in one of four runs: srt (how a sample is decoded) and sera (which
    prompts a micro-batch gets) act on separate things, so one run checks both. The killed
    run has one colocated worker (`ONE_WORKER`): what is tested is the resume."""
    from flows.cluster.start import ClusterConfig
    from flows.train import TrainParams, train

    cfg = with_echo(policy_config(tmp_path, longtail_model, "longtail", backend="hf", **policies))
    if policies["rollout"]["policy"] == "sparse":
        cfg = corrected(cfg)
    run_dir = tmp_path / "run"

    def step_one_trained() -> bool:
        store = run_store(run_dir)
        return store is not None and store.table("counter").consumption(1) is not None

    kill_cli_train_when(
        step_one_trained,
        cfg,
        run_dir,
        prefect_server,
        tmp_path / "run.log",
        "step 1 trained",
        cluster=ONE_WORKER,
    )
    assert not (run_dir / "summary.json").exists()
    out = train(
        TrainParams(
            resume=str(run_dir), cluster=ClusterConfig(scheduler=cluster), export_final=False
        )
    )
    # steps 2 and 3, or 1 to 3 if the kill came before the checker's step 1 was recorded
    store = clean(out, steps=(2, 3))
    for agent in ("counter", "checker"):
        ids = store.table(agent).read().sample_id
        assert len(np.unique(ids)) == len(ids)
        assert sorted(store.table(agent).consumption_log()) == [0, 1, 2, 3]
    rows = store.table("counter").read()
    rollout, select = policies["rollout"]["policy"], policies.get("select", {}).get("policy")
    if rollout == "rollverify":
        assert (rows.finish_reason == "verified").any()
    if select == "sera":  # 4 episodes per step
        for k in range(4):
            assert len(set(rows.episode[rows.step == k].tolist())) == 4
    if rollout == "srt":  # the samples before the kill are exact
        assert (rows.policy_version == 0).sum() >= 8  # step 0's, of the model as built
        assert logprob_gap(longtail_model, rows) < 1e-4
    if rollout == "sparse":  # the samples before the kill are the sparse sampler's
        assert logprob_gap(longtail_model, rows) > 1e-3
    if rollout == "darts":  # n = 4 kept per group, none of the dropped stored
        assert set(np.unique(rows.group_id, return_counts=True)[1]) == {4}
        assert not (rows.finish_reason == "dropped").any()
