"""Richer graphs end to end: critics who debate a proposal (an exchange after a node), and
`chat:` prompts rendered with the tokenizer's chat template, on real components."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.store import MEGStore
from tests.flows.conftest import write_config
from workloads import BUILTIN
from workloads.datasets import TaskItem

pytestmark = pytest.mark.slow


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


def train_builtin(name: str, model: str, tmp: Path, cluster: str) -> tuple[Path, MEGStore]:
    """A built-in workload with every agent on `model`, trained 2 steps and audited clean."""
    data = yaml.safe_load(BUILTIN[name].read_text())
    for agent in data["agents"].values():
        agent["model"] = model
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run(cfg, tmp, cluster)
    assert out["steps"] == 2 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    assert audit_consistency(store).accounting_errors == 0
    return cfg, store


def test_critics_debate_a_proposal_and_a_judge_decides(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    _, store = train_builtin("critic-debate", tiny_model, tmp_path, cluster)
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


def test_word_problems_train_with_math_verify_rewards_in_worker_threads(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """The built-in word-problems MEG on a real cluster: math-verify scores every node from
    Dask worker threads, and the reviser sees the verdict and the answer it judged."""
    from transformers import AutoTokenizer

    from flows.runs.config import load_config
    from workloads.datasets import load_dataset
    from workloads.math_rewards import math_correct

    cfg, store = train_builtin("word-problems", tiny_model, tmp_path, cluster)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tasks = {t.question: t for t in load_dataset(load_config(str(cfg)).dataset).train}
    solve = store.table("solver").read(step=0)
    verify = store.table("verifier").read(step=0)
    revise = store.table("reviser").read(step=0)
    assert (len(solve), len(verify), len(revise)) == (2 * 4, 2 * 4 * 2, 2 * 4 * 2 * 2)
    for i in range(len(solve)):  # the stored reward is math-verify's verdict on the text
        text = tok.decode(solve.response(i).tolist(), skip_special_tokens=True)
        prompt = tok.decode(solve.prompt(i).tolist())  # "Q: {question}\nA:"
        task = tasks[prompt.removeprefix("Q: ").removesuffix("\nA:")]
        assert solve.reward[i] == float(math_correct(text, task))
    verify_parent = dict(zip(verify.sample_id, verify.parent_ids, strict=True))
    for parents in revise.parent_ids:
        v, s = str(parents).split(",")
        assert verify_parent[v] == s  # the answer shown is the one this verdict judged


def test_longtail_trains_and_scores_lists(tmp_path: Path, tiny_model: str, cluster: str) -> None:
    """The long-tail MEG on a real cluster: its plug-in's rewards score every row."""
    from transformers import AutoTokenizer

    from workloads.longtail import sequence_correct

    _, store = train_builtin("longtail", tiny_model, tmp_path, cluster)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    count = store.table("counter").read(step=1)
    assert len(count) == 2 * 4 and len(store.table("checker").read(step=1)) == 2 * 4 * 2
    for i in range(len(count)):
        prompt = tok.decode(count.prompt(i).tolist())  # "Q: list a..b\nA:"
        lo, hi = prompt.removeprefix("Q: list ").removesuffix("\nA:").split("..")
        task = TaskItem("t", "", " ".join(str(x) for x in range(int(lo), int(hi) + 1)))
        text = tok.decode(count.response(i).tolist(), skip_special_tokens=True)
        assert count.reward[i] == float(sequence_correct(text, task))
