"""Richer graphs end to end: critics who debate a proposal (an exchange after a node), and
`chat:` prompts rendered with the tokenizer's chat template, on real components."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from flows.cluster import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.store import MEGStore
from tests.flows.conftest import write_config

pytestmark = pytest.mark.slow
CRITIC_DEBATE = Path(__file__).parents[2] / "workloads" / "critic_debate.yaml"


def run(cfg: Path, tmp: Path, cluster: str) -> dict:
    return train(
        TrainParams(
            config=str(cfg),
            steps=2,
            episodes_per_step=2,
            micro_batches=1,
            run_dir=str(tmp / "run"),
            cluster=ClusterConfig(scheduler=cluster),
            export_final=False,
        )
    )


def test_critics_debate_a_proposal_and_a_judge_decides(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    data = yaml.safe_load(CRITIC_DEBATE.read_text())
    for agent in data["agents"].values():
        agent["model"] = tiny_model
    cfg = tmp_path / "critic-debate.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run(cfg, tmp_path, cluster)
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    assert audit_consistency(store).accounting_errors == 0
    props = store.table("proposer").read(step=0)
    skeptic = store.table("skeptic").read(step=0)
    # 2 episodes × 2 proposals; each proposal is debated: one skeptic turn per round
    assert len(props) == 4 and len(skeptic) == 2 * 4
    prop_ids = {str(s) for s in props.sample_id}
    for parents in skeptic.parent_ids:  # every turn shows exactly one proposal
        assert len(set(str(parents).split(",")) & prop_ids) == 1
    judge = store.table("judge").read(step=0)
    assert len(judge) == 2 * 2 * 2  # one judge invocation (n = 2) per proposal


def test_chat_nodes_prompt_inside_the_tokenizers_chat_template(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    from transformers import AutoTokenizer

    cfg = write_config(tmp_path, tiny_model)
    data = yaml.safe_load(cfg.read_text())
    solve = data["nodes"]["solve"]
    solve["chat"] = {"system": "Answer with a number.", "user": solve.pop("template")}
    cfg.write_text(yaml.safe_dump(data))
    out = run(cfg, tmp_path, cluster)
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    tok = AutoTokenizer.from_pretrained(tiny_model)
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    rows = store.table("solver").read(step=0)
    prompt = tok.decode(rows.prompt(0).tolist())
    assert prompt.startswith("<|system|>\nAnswer with a number.\n<|user|>\nQ: ")
    assert prompt.endswith("=\nA:\n<|assistant|>\n")
    verify = store.table("verifier").read(step=0)  # a plain node beside it: no frame
    assert not tok.decode(verify.prompt(0).tolist()).startswith("<|")
    assert np.all(np.isfinite(rows.reward))
