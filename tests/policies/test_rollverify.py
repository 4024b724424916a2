"""`rollverify`: a node whose reward can judge a prefix is sampled under `Verify`, one
request per sample; elsewhere plainly; a MEG whose rewards cannot judge any prefix is
refused, naming those that can (checked against the real reward registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meg.policies import RollVerify
from policies.base import NodeRequests
from policies.rollverify import EarlyVerify, Verify
from tests.policies.conftest import load, refused
from workloads.datasets import TaskItem
from workloads.rewards import early_check

TASKS = [TaskItem("t0", "1+1", "2"), TaskItem("t1", "2+2", "4")]


def test_rollverify_watches_only_a_node_whose_reward_judges_a_prefix() -> None:
    policy = EarlyVerify(RollVerify(policy="rollverify", every=3))
    assert policy.watch(NodeRequests(2, TASKS, None, str)) is None  # no verdict: one plain batch
    decided = early_check("exact_answer")
    assert decided is not None
    chosen = policy.watch(NodeRequests(2, TASKS, decided, lambda ids: "".join(map(chr, ids))))
    assert chosen is not None
    watch, launched = chosen
    assert launched == 2 and isinstance(watch, Verify) and watch.every == 3
    assert [t.id for t in watch.tasks] == ["t0", "t0", "t1", "t1"]  # per request


def test_rollverify_needs_a_reward_that_judges_a_prefix(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """`exact_answer` can judge a prefix, `verdict` cannot; a MEG whose only reward is
    `verdict` is refused, naming the ones that can."""
    base["run"] = {"rollout": {"policy": "rollverify"}}
    assert load(base, tmp_path).run.rollout == RollVerify(policy="rollverify")
    base["rewards"] = {"y": {"fn": "verdict", "params": {"target": "x"}}}
    err = refused(base, tmp_path)
    assert err.field == "run.rollout"
    assert "no node's reward can judge a prefix" in str(err)
    assert "rewards that can: exact_answer" in str(err)


def test_verify_decodes_incrementally_and_decides_as_the_full_decode(tiny_model: str) -> None:
    """With the fast tokenizer's backend, each token is decoded once and only a verdict of
    "decided" is checked on the full decode: the stops are exactly those of judging the full
    decode of every prefix, with one full decode per stop."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    full_decodes = []

    def decode(ids: object) -> str:
        full_decodes.append(1)
        return tok.decode(list(ids), skip_special_tokens=True)  # type: ignore[call-overload]

    def has_digit_then_more(text: str, task: TaskItem) -> bool:
        return any(c.isdigit() for c in text[:-1])

    rng = random.Random(0)
    rows = [[rng.randrange(len(tok)) for _ in range(40)] for _ in range(6)]
    fast = Verify(
        has_digit_then_more, [TASKS[0]] * 6, decode, every=1, tokenizer=tok.backend_tokenizer
    )
    slow = Verify(has_digit_then_more, [TASKS[0]] * 6, decode, every=1)
    stops = 0
    for i, row in enumerate(rows):
        for n in range(1, len(row) + 1):
            full_decodes.clear()
            stop = fast.stop(i, row[:n])
            assert len(full_decodes) == int(stop)  # a full decode only to confirm a stop
            assert stop == slow.stop(i, row[:n]) == has_digit_then_more(decode(row[:n]), TASKS[0])
            if stop:
                stops += 1
                break
    assert stops > 0  # the rule did stop rows (and each stop was confirmed once)
