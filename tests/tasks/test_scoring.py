"""The score task's body (`score_rows`) on hand-written rows of math-chain: rewards
read the decoded response text, so responses are encoded with the tiny model's tokenizer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from flows.orchestrator.planning import scoring_plan
from meg import InvocationPlan, ScoreGroup, expand_episode
from storage.schema import SampleBatch, SegmentKey
from tasks import accounting, scoring
from tasks.accounting import read_scored, scored_rows
from tasks.context import RunContext, Timing
from tasks.refs import Episode, GenRef, RewardSum, episode_id
from tasks.scoring import rows_to_hand, score_rows
from tasks.worker import store_of, tokenizer_of
from tests.tasks.conftest import math_chain
from workloads.datasets import TaskItem, load_dataset

Respond = Callable[[TaskItem, InvocationPlan, int], str]

# solver samples of each episode: which answer right (1) or wrong (0)
SOLVE_CORRECT = ([1, 0, 1, 0], [1, 0, 0, 0])


def group_of(ctx: RunContext, node: str) -> ScoreGroup:
    (group,) = [g for g in scoring_plan(ctx.spec) if node in g.nodes]
    return group


def commit_rows(
    ctx: RunContext, node: str, step: int, mb: int, episodes: tuple[Episode, ...], respond: Respond
) -> SampleBatch:
    """Commit the node's rows of (step, mb) exactly as the generate task lays them out
    (structural sample ids, groups, parents), with `respond(task, plan, i)` as response text."""
    spec = ctx.spec
    agent = spec.nodes[node].agent
    tok = tokenizer_of(ctx, agent)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    for eid, item in episodes:
        for plan in expand_episode(spec, eid).invocations[node]:
            for i, sid in enumerate(plan.sample_ids(spec.nodes[node].n)):
                response = encode(respond(item, plan, i))
                rows.append(
                    {
                        "sample_id": sid,
                        "group_id": plan.group_id,
                        "parent_ids": plan.parent_ids(),
                        "node": node,
                        "episode": eid,
                        "step": step,
                        "policy_version": step,
                        "prompt_ids": encode(f"Q: {item.question}=\nA:"),
                        "response_ids": response,
                        "logprobs": [-1.0] * len(response),
                        "finish_reason": "stop",
                    }
                )
    batch = SampleBatch.from_rows(rows)
    store_of(ctx).table(agent).write_segment(SegmentKey(step, mb, node), batch)
    return batch


def answer(item: TaskItem, correct: bool) -> str:
    return f" {item.answer if correct else int(item.answer) + 1}\n"


def solver_answers(item: TaskItem, plan: InvocationPlan, i: int) -> str:
    episode = int(plan.episode.rsplit("e", 1)[1])
    return answer(item, bool(SOLVE_CORRECT[episode][i]))


@pytest.fixture
def chain(new_ctx, tiny_model: str) -> tuple[RunContext, tuple[Episode, ...]]:
    ctx = new_ctx(spec=math_chain(tiny_model, n=4))
    train = load_dataset(ctx.spec.dataset).train
    return ctx, tuple((episode_id(0, i), train[i]) for i in range(len(SOLVE_CORRECT)))


def scores_by_sample(ctx: RunContext, agent: str, node: str) -> dict[str, tuple[float, float]]:
    b = store_of(ctx).table(agent).read(step=0, node=node, micro_batch=0)
    return {
        str(s): (float(r), float(a))
        for s, r, a in zip(b.sample_id, b.reward, b.advantage, strict=True)
    }


def test_solve_scores_are_exact_answer_rewards_and_group_advantages(chain) -> None:
    ctx, episodes = chain
    batch = commit_rows(ctx, "solve", 0, 0, episodes, solver_answers)
    tok = tokenizer_of(ctx, "solver")
    assert tok.decode(batch.response(0).tolist()) == answer(episodes[0][1], True)  # round-trips

    group = group_of(ctx, "solve")
    assert group.nodes == ("solve",) and group.loads == ("solve",)  # exact_answer reads nothing
    ref = score_rows(ctx, 0, 0, episodes, group)[0]

    scored = scores_by_sample(ctx, "solver", "solve")
    assert len(scored) == 8
    for e, (eid, _) in enumerate(episodes):
        ids = [f"{eid}/solve/0/{i}" for i in range(4)]
        rewards = [scored[s][0] for s in ids]
        advantages = np.array([scored[s][1] for s in ids])
        assert rewards == SOLVE_CORRECT[e]
        assert advantages.sum() == pytest.approx(0.0, abs=1e-5)
        # GRPO: (r - mean) / (std + eps), std with Bessel's correction
        r = np.array(rewards, dtype=np.float64)
        want = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(advantages, want, rtol=1e-5)
        assert all((a > 0) == bool(c) for a, c in zip(advantages, rewards, strict=True))

    solved = sum(map(sum, SOLVE_CORRECT))
    assert (ref.step, ref.micro_batch, ref.nodes, ref.rows) == (0, 0, ("solve",), 8)
    assert ref.agent_reward == {"solver": RewardSum(float(solved), 8)}
    assert ref.team == RewardSum(float(solved), 8)  # solve is math-chain's team node
    batch, _ = read_scored(ctx, "solver", 0, 0)  # the training task can read them now
    assert np.isfinite(batch.advantage).all()


def test_verify_scores_read_the_solver_answer_they_judge(chain) -> None:
    ctx, episodes = chain
    commit_rows(ctx, "solve", 0, 0, episodes, solver_answers)
    verdicts = (" yes", " no")  # each verifier invocation says yes once and no once
    commit_rows(ctx, "verify", 0, 0, episodes, lambda item, plan, i: verdicts[i])

    group = group_of(ctx, "verify")
    assert group.nodes == ("verify",) and set(group.loads) == {"solve", "verify"}
    ref = score_rows(ctx, 0, 0, episodes, group)[0]

    scored = scores_by_sample(ctx, "verifier", "verify")
    assert len(scored) == 2 * 8  # n=2 per solver sample
    for e, (eid, _) in enumerate(episodes):
        for s, correct in enumerate(SOLVE_CORRECT[e]):
            group_ids = [f"{eid}/verify/{s}/{i}" for i in range(2)]
            rewards = [scored[g][0] for g in group_ids]
            assert rewards == [float(correct), float(not correct)]  # yes right iff correct
            assert sum(scored[g][1] for g in group_ids) == pytest.approx(0.0, abs=1e-5)
    assert ref.agent_reward == {"verifier": RewardSum(8.0, 16)}
    assert ref.team == RewardSum()  # the team node (solve) is not scored by this group
    solve = scores_by_sample(ctx, "solver", "solve")
    assert all(np.isnan(r) and np.isnan(a) for r, a in solve.values())  # left to its group


def test_rows_handed_to_the_trainer_are_the_rows_it_would_read(new_ctx, monkeypatch) -> None:
    """A fused generate hands its agent's trainer the scored rows (`GenRef.scored`, up to
    `HAND_MAX_BYTES`) instead of the trainer reading back the two segments just committed:
    the same rows, column for column and type for type (strings: a width of their own).
    Without them (a resumed ref, another micro-batch) the trainer reads the store."""
    ctx = new_ctx()  # one agent (solver), one node (solve)
    train = load_dataset(ctx.spec.dataset).train
    episodes = tuple((episode_id(0, i), train[i]) for i in range(len(SOLVE_CORRECT)))
    batch = commit_rows(ctx, "solve", 0, 0, episodes, solver_answers)  # as built, in memory
    score, joined = score_rows(ctx, 0, 0, episodes, group_of(ctx, "solve"), {"solve": batch})
    stored, segments = read_scored(ctx, "solver", 0, 0)
    hand = rows_to_hand(ctx, "solve", joined)
    assert hand is not None and 0 < hand.nbytes <= scoring.HAND_MAX_BYTES
    for name, column in stored.columns().items():
        got = getattr(hand, name)
        # strings: the same values, a width of their own (the store reads back its widest)
        assert got.dtype == column.dtype or got.dtype.kind == column.dtype.kind == "U", name
        assert np.array_equal(got, column, equal_nan=got.dtype.kind == "f"), name

    table = store_of(ctx).table("solver")
    segment = table.ref(table.has_segment(SegmentKey(0, 0, "solve")))
    timing = Timing("generate", "solver", 0, 0, "w", 0.0, 1.0)
    ref = GenRef("solve", "solver", 0, 0, segment, len(batch), 0, (0,), False, timing)
    ref = dataclasses.replace(ref, score=score, scored=hand)
    calls: list[int] = []
    monkeypatch.setattr(
        accounting, "read_scored", lambda c, a, k, mb: calls.append(mb) or (stored, segments)
    )
    got, ids = scored_rows(ctx, "solver", 0, 0, (ref,))
    assert got is hand and ids == segments and calls == []  # in hand: no read
    scored_rows(ctx, "solver", 0, 0, (dataclasses.replace(ref, scored=None),))
    scored_rows(ctx, "solver", 0, 1, (ref,))  # its rows are micro-batch 0's
    assert calls == [0, 1]
    # rows past the cap stay in the store: the driver fetches every GenRef too
    monkeypatch.setattr(scoring, "HAND_MAX_BYTES", hand.nbytes - 1)
    assert rows_to_hand(ctx, "solve", joined) is None
