"""`run.rollout_gradients`: micro-batches back-propagated on the rollout workers that sampled
them, added and stepped by the trainer. Which runs may and which `auto` turns it on for; a
real run with it on trains what a run with it off trains."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from bench.peer_job import Job, meg_config
from flows.cluster.start import ClusterConfig
from flows.orchestrator.rollout_grads import (
    AUTO_MAX_PARAMETERS,
    decide_auto,
    gradient_agents,
    on_problem,
    why_not,
)
from flows.runs.config import load_config
from flows.runs.record import RunError
from flows.train import TrainParams, check, train
from meg import MEGSpec
from storage.audit import audit_consistency
from storage.store import MEGStore
from tasks.grad_parts import grad_part
from tasks.refs import GradPart
from tests.flows.conftest import write_config

SMALL = 500_000


def peer(tmp_path: Path, model: str, agent: dict[str, Any] | None = None, **run: Any) -> Path:
    """The TRL peer job's one-node MEG (2 prompts × 2 samples × 4 tokens, 2 micro-batches)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = meg_config(Job(2, 2, 4, 3), model, tmp_path, backend="hf")
    data = yaml.safe_load(path.read_text())
    data["agents"]["policy"].update(agent or {})
    data["run"].update(run)
    path.write_text(yaml.safe_dump(data))
    return path


def spec_of(tmp_path: Path, model: str, agent: dict[str, Any] | None = None, **run: Any) -> MEGSpec:
    return load_config(str(peer(tmp_path, model, agent, **run)))


def test_only_a_one_node_full_weight_float32_on_policy_agent_may(
    tmp_path: Path, tiny_model: str
) -> None:
    assert why_not(spec_of(tmp_path, tiny_model), "policy") is None
    refused = [
        ({"lora": {"r": 4}}, {}, "LoRA adapter"),
        ({"dtype": "bfloat16"}, {}, "it trains in bfloat16"),
        ({}, {"mode": "async", "staleness": 1}, "older version"),
        ({}, {"rollout": {"policy": "april"}}, "carries partial rollouts"),
    ]
    for agent, run, why in refused:
        assert why in str(why_not(spec_of(tmp_path, tiny_model, agent, **run), "policy"))
    chain = load_config(str(write_config(tmp_path, tiny_model)))  # math-chain: two nodes
    assert "the MEG has 2 nodes" in str(why_not(chain, "solver"))


def test_on_is_refused_at_plan_time_where_it_cannot_apply(tmp_path: Path, tiny_model: str) -> None:
    spec = spec_of(tmp_path, tiny_model, {"lora": {"r": 4}}, rollout_gradients="on")
    assert "agent 'policy' cannot back-propagate on its rollout workers: it trains a LoRA" in str(
        on_problem(spec)
    )
    bad = peer(tmp_path, tiny_model, {"dtype": "bfloat16"}, rollout_gradients="on")
    with pytest.raises(RunError, match=r"run.rollout_gradients: on, but .* bfloat16"):
        check(TrainParams(config=str(bad), run_dir=str(tmp_path / "r")))
    ok = spec_of(tmp_path, tiny_model, rollout_gradients="on")
    assert on_problem(ok) is None and gradient_agents(ok) == {"policy"}
    assert gradient_agents(spec_of(tmp_path, tiny_model, rollout_gradients="off")) == set()
    assert gradient_agents(spec_of(tmp_path, tiny_model)) == set()  # auto: not decided yet


def test_auto_turns_it_on_only_where_it_was_measured_faster(
    tmp_path: Path, tiny_model: str
) -> None:
    spec = spec_of(tmp_path, tiny_model)
    on, line = decide_auto(spec, rollout_workers=2, gpus=0, own_cluster=True, parameters=SMALL)
    assert on and "2 rollout workers for 2 micro-batches" in line
    for kwargs, why in [
        ({"rollout_workers": 1}, "1 rollout worker(s), 2 micro-batches"),
        ({"gpus": 1}, "1 GPU(s) seen"),
        ({"own_cluster": False}, "another cluster's"),
        ({"parameters": None}, "cannot be read here"),
        ({"parameters": AUTO_MAX_PARAMETERS + 1}, "measured faster up to"),
    ]:
        args = {"rollout_workers": 2, "gpus": 0, "own_cluster": True, "parameters": SMALL}
        on, line = decide_auto(spec, **{**args, **kwargs})  # type: ignore[arg-type]
        assert not on and why in line, kwargs
    one = spec_of(tmp_path, tiny_model, micro_batches=1)
    assert not decide_auto(one, 4, 0, True, SMALL)[0]  # nothing to spread
    lora = spec_of(tmp_path, tiny_model, {"lora": {"r": 4}})
    assert "LoRA" in decide_auto(lora, 2, 0, True, SMALL)[1]


def test_a_part_is_taken_only_at_the_trainers_version_over_its_rows() -> None:
    part = GradPart("policy", 3, 1, 7, {"parts": [[1, 40, 8]]}, {}, 0.01)
    other = GradPart("policy", 3, 0, 7, {"parts": [[0, 40, 8]]}, {}, 0.01)
    after = (SimpleNamespace(grad=other), SimpleNamespace(grad=part), SimpleNamespace(grad=None))
    assert grad_part(after, "policy", 3, 1, 7, (40, 8)) is part
    assert grad_part(after, "policy", 3, 0, 7, (40, 8)) is other
    for miss in [
        ("policy", 3, 1, 6, (40, 8)),  # a trainer rebuilt at another version
        ("policy", 3, 1, 7, (41, 8)),  # other rows than the part's
        ("policy", 4, 1, 7, (40, 8)),
        ("critic", 3, 1, 7, (40, 8)),
    ]:
        assert grad_part(after, *miss) is None, miss


def _final_weights(out: dict[str, Any]) -> dict[str, Any]:
    return load_file(str(Path(out["run_dir"]) / "final" / "policy" / "model.safetensors"))


@pytest.mark.slow
def test_a_run_with_it_on_trains_what_a_run_with_it_off_trains(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    outs = {}
    for setting in ("off", "on"):
        meg = peer(tmp_path / setting, tiny_model, rollout_gradients=setting)
        data = yaml.safe_load(meg.read_text())  # rewards that vary with the text: a gradient
        data["rewards"] = {n: {"fn": "length_penalty"} for n in data["rewards"]}
        meg.write_text(yaml.safe_dump(data))
        outs[setting] = train(
            TrainParams(
                config=str(meg),
                run_dir=str(tmp_path / setting / "run"),
                cluster=ClusterConfig(scheduler=cluster),
            )
        )
    for out in outs.values():
        store = MEGStore.open(out["store_url"], out["run_id"], create=False)
        audit = audit_consistency(store)
        assert (audit.violations, audit.accounting_errors, audit.steps_checked) == (0, 0, 3)
    off, on = (MEGStore.open(o["store_url"], o["run_id"], create=False) for o in outs.values())
    log_off, log_on = (s.table("policy").consumption_log() for s in (off, on))
    for k in range(3):  # the same rows, the same micro-batches, the same losses
        assert log_on[k]["extra"]["trained"] == log_off[k]["extra"]["trained"]
        # every micro-batch's part was added: none refused and recomputed on the trainer
        mbs = len(log_on[k]["extra"]["trained"])
        assert log_on[k]["extra"]["parts"] == {"added": mbs}, k
        assert log_off[k]["extra"]["parts"] == {"trained": mbs}, k
        for key in ("loss", "grad_norm"):
            assert log_on[k]["extra"][key] == pytest.approx(log_off[k]["extra"][key], rel=1e-4)
    rows_off, rows_on = off.table("policy").read(), on.table("policy").read()
    assert sorted(map(str, rows_on.sample_id)) == sorted(map(str, rows_off.sample_id))
    w_off, w_on = _final_weights(outs["off"]), _final_weights(outs["on"])
    moved = max(
        float((w_off[k] - load_file(str(Path(tiny_model) / "model.safetensors"))[k]).abs().max())
        for k in w_off
    )
    assert moved > 1e-4
    for k in w_off:
        assert float((w_on[k] - w_off[k]).abs().max()) < 1e-5, k
    phases = {
        r["phase"] for r in json.loads((Path(outs["on"]["run_dir"]) / "timeline.json").read_text())
    }
    assert "train_micro_batch" not in phases and "optimizer_step" in phases  # added, not trained
    assert outs["on"]["gradient_parts"] == {"added": 3 * mbs}
    assert [r["gradient_parts"] for r in outs["on"]["per_step"]] == [{"added": mbs}] * 3
    phases = {
        r["phase"] for r in json.loads((Path(outs["off"]["run_dir"]) / "timeline.json").read_text())
    }
    assert "train_micro_batch" in phases
