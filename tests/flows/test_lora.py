"""LoRA agents end to end on real components: a base shared by several agents' adapters on
the rollout worker and on the training worker, adapter-only publication, checkpoints and
export, in flex and async, beside a full-weight agent; a killed run resumes its adapters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from peft import PeftModel
from transformers import AutoModelForCausalLM

from engines.training.lora import is_adapter_dir, read_adapter
from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.state import StateStore
from storage.store import MEGStore
from tests.flows.conftest import ONE_WORKER, kill_cli_train_when, write_config

pytestmark = pytest.mark.slow

LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
CASES = {  # workload → the agents that are adapters on the shared base
    "debate": ("alice", "bob"),  # the judge keeps full weights: a mixed MEG
    "fanout": ("planner", "short", "medium", "long", "aggregator"),  # five adapters, one base
}


def lora_config(
    tmp: Path, model: str, workload: str, *, backend: str | None = None, **run: Any
) -> Path:
    cfg = write_config(tmp, model, workload, backend=backend, **run)
    data = yaml.safe_load(cfg.read_text())
    for agent in CASES[workload]:
        data["agents"][agent]["lora"] = LORA
        data["agents"][agent]["optim"] = {"lr": 5e-3}
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def _hosted(scheduler: str) -> dict[str, dict[str, int]]:
    from distributed import Client

    from engines.rollout.hosts import hosted_agents

    with Client(scheduler) as client:
        return client.run(hosted_agents)


def _engine_counts() -> tuple[int, int, int]:
    """(live vLLM backends, parked engines, vLLM hosts) of this worker process."""
    from engines.rollout import hosts
    from engines.rollout.vllm_engines import ENGINES

    vllm = sum(h.backend_name == "vllm" for h in hosts._HOSTS.values())
    return ENGINES.live, len(ENGINES.parked), vllm


@pytest.mark.parametrize("workload", sorted(CASES))
@pytest.mark.parametrize(("mode", "staleness"), [("flex", 0), ("async", 1)])
def test_adapters_on_one_base_train_end_to_end(
    tmp_path: Path, tiny_model: str, cluster: str, workload: str, mode: str, staleness: int
) -> None:
    steps = 3
    cfg = lora_config(tmp_path, tiny_model, workload, steps=steps)
    out = train(
        TrainParams(
            config=str(cfg),
            mode=mode,
            staleness=staleness,
            run_dir=str(tmp_path / "run"),
            cluster=ClusterConfig(scheduler=cluster),
        )
    )
    lora_agents = CASES[workload]
    spec_agents = yaml.safe_load(cfg.read_text())["agents"]
    assert out["steps"] == steps
    assert out["consistency"]["violations"] == 0
    assert out["consistency"]["max_lag"] == staleness
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.accounting_errors, audit.steps_unverified) == (0, 0)
    assert audit.steps_checked == steps * len(spec_agents)
    # one engine for the shared base, one per full-weight agent, on the rollout worker
    shared = "+".join(a for a in spec_agents if a in lora_agents)  # named in the spec's order
    units = {shared} | {a for a in spec_agents if a not in lora_agents}
    run_hosts = {
        key.split("/", 1)[1]
        for hosts in _hosted(cluster).values()
        for key in hosts
        if key.startswith(f"{out['run_id']}/")
    }
    assert run_hosts == units
    # the session cluster served earlier runs: this run took over the engines it could use
    # (reset) and shut the others down, so a worker holds exactly this run's engines
    # (nothing parked)
    from distributed import Client

    with Client(cluster) as client:
        counts = client.run(_engine_counts)
    assert all(live == hosts and parked == 0 for live, parked, hosts in counts.values())
    assert sum(hosts for _, _, hosts in counts.values()) == len(units)
    state = StateStore(f"{out['store_url'].rstrip('/')}/{out['run_id']}/_state")
    for agent in spec_agents:
        log = store.table(agent).consumption_log()
        assert [r["extra"]["version_after"] for r in log.values()] == list(range(1, steps + 1))
        if mode == "flex":  # every row of step k sampled with exactly version k
            for k in range(steps):
                assert set(store.table(agent).read(step=k).policy_version.tolist()) == {k}
        tensors, meta = state.get(f"weights/{agent}/v{steps:06d}")
        final = tmp_path / "run" / "final" / agent
        if agent in lora_agents:  # adapters only, in PEFT's names, config published along
            assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
            assert meta["lora"]["r"] == 8 and meta["lora"]["peft_type"] == "LORA"
            assert is_adapter_dir(final) and not (final / "config.json").exists()
        else:
            assert "model.embed_tokens.weight" in tensors and "lora" not in meta
            assert (final / "config.json").is_file()
    # the exported adapter is the last step's published policy, and peft loads it
    agent = lora_agents[0]
    final = tmp_path / "run" / "final" / agent
    published, _ = state.get(f"weights/{agent}/v{steps:06d}")
    exported, _ = read_adapter(final)
    assert exported.keys() == published.keys()
    assert all(torch.equal(exported[k], published[k]) for k in published)
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), final)


def test_killed_lora_run_resumes_its_adapters(
    tmp_path: Path, tiny_model: str, prefect_server: str, cluster: str
) -> None:
    """SIGKILL of a whole run with adapter agents mid-step; `--resume` continues from the
    adapter checkpoints: each agent's versions go on from where they stopped, no step is
    trained twice, and the audit is clean."""
    cfg = lora_config(tmp_path, tiny_model, "debate", backend="hf", steps=4, episodes_per_step=4)
    run_dir = tmp_path / "run"

    def mid_step() -> bool:  # alice stepped twice, step 2's rollout committed in part
        tables = sorted((run_dir / "store").glob("*/alice"))
        return (
            bool(tables)
            and (tables[0] / "consumed" / "1.json").exists()
            and any((tables[0] / "commits").glob("k000002-*"))
        )

    kill_cli_train_when(  # on one colocated worker: what is tested is the resume
        mid_step,
        cfg,
        run_dir,
        prefect_server,
        tmp_path / "run.log",
        "alice's second step",
        cluster=ONE_WORKER,
    )
    ckpts = sorted((p for p in run_dir.glob("store/*/_checkpoints/alice/v*")), key=str)
    assert ckpts and all(is_adapter_dir(c) for c in ckpts if (c / "meta.json").exists())
    # resumed on the session's cluster: which cluster a resume runs on is not what this tests
    out = train(TrainParams(resume=str(run_dir), cluster=ClusterConfig(scheduler=cluster)))
    assert out["resumed_segments"] > 0 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.accounting_errors, audit.steps_unverified) == (0, 0)
    for agent in ("alice", "bob", "judge"):
        log = store.table(agent).consumption_log()
        assert sorted(log) == [0, 1, 2, 3]
        assert [log[k]["extra"]["version_after"] for k in range(4)] == [1, 2, 3, 4]
        ids = store.table(agent).read().sample_id
        assert len(np.unique(ids)) == len(ids)
    info = json.loads((run_dir / "final" / "alice" / "flexmarl.json").read_text())
    assert info["version"] == 4 and info["base_model"] == tiny_model
