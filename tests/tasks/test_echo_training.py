"""EchoRL through the training tasks: the clips come from the committed rows alone (rewards,
advantages, stored behaviour logprobs, the agent's tokenizer), so a training worker that
dies mid-step and replays from the store and an old checkpoint trains exactly the clips the
uninterrupted run did."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import yaml

from meg import MEGSpec, build_spec, validate
from tasks.accounting import echo_lengths, read_scored
from tasks.context import RunContext
from tasks.training import accumulate_micro_batch, step_agent
from tasks.worker import store_of, tokenizer_of
from tests.tasks.conftest import drop_trainers, write_scored
from tests.tasks.test_training import AGENT, MBS, NODE, assert_same_run
from workloads import BUILTIN
from workloads.rewards import known_rewards

ECHO = {"coef": 0.5, "delimiter": " "}


def echo_spec(model: str, echo: dict | None) -> MEGSpec:
    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    del data["agents"]["verifier"], data["nodes"]["verify"], data["rewards"]["verify"]
    data["agents"]["solver"] |= {"model": model, "loss": {} if echo is None else {"echo": echo}}
    data["nodes"]["solve"]["n"] = 2
    return validate(build_spec(data), known_rewards=known_rewards())


# two groups of two: the first all right (reward 1, advantage 0), the second mixed
SCORES = ([1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, -1.0])


def write_rows(ctx: RunContext, step: int, mb: int) -> None:
    write_scored(ctx, AGENT, NODE, step, mb, scores=SCORES)


def run_steps(ctx: RunContext, steps: int, drop_at: tuple[int, int] | None = None) -> list:
    out = []
    for k in range(steps):
        trains = []
        for j in range(MBS + 1):
            if drop_at == (k, j):
                drop_trainers(ctx)
            if j < MBS:
                write_rows(ctx, k, j)
                trains.append(accumulate_micro_batch(ctx, AGENT, k, j))
        out.append(step_agent(ctx, AGENT, k, tuple(trains)))
    return out


def test_clips_come_from_the_store_one_per_all_right_group(new_ctx, tiny_model: str) -> None:
    ctx = new_ctx("clips", spec=echo_spec(tiny_model, ECHO))
    write_rows(ctx, 0, 0)
    batch, _ = read_scored(ctx, AGENT, 0, 0)
    clips = echo_lengths(ctx, AGENT, batch)
    assert clips is not None and clips[2:] == [0, 0] and sum(c > 0 for c in clips[:2]) == 1
    tok = tokenizer_of(ctx, AGENT)
    i = int(np.argmax(clips))
    text = [tok.decode([int(t)]) for t in batch.response(i)[: clips[i]]]
    assert clips[i] == len(batch.response(i)) or " " in text[-1]  # the clip ends a step
    plain = new_ctx("plain", spec=echo_spec(tiny_model, None))
    assert echo_lengths(plain, AGENT, batch) is None


@pytest.mark.parametrize("drop_at", [(1, 1), (1, MBS)], ids=["between-mbs", "before-step"])
def test_a_restarted_worker_trains_the_same_clips(new_ctx, tiny_model, drop_at, caplog) -> None:
    spec = echo_spec(tiny_model, ECHO)
    ref = new_ctx("ref", spec=spec, checkpoint_every=2)  # the restart replays step 0 too
    ref_steps = run_steps(ref, 2)
    got = new_ctx("restarted", spec=spec, checkpoint_every=2)
    with caplog.at_level(logging.WARNING, logger="tasks.accounting"):
        got_steps = run_steps(got, 2, drop_at=drop_at)
    assert "replayed step 0 from the store" in caplog.text
    assert_same_run(got, got_steps, ref, ref_steps)
    rec = store_of(got).table(AGENT).consumption(1)
    assert rec is not None and 0 < rec["extra"]["metrics"]["echo_frac"] < 0.5
    plain = new_ctx("plain", spec=echo_spec(tiny_model, None), checkpoint_every=2)
    assert [s.loss for s in run_steps(plain, 2)] != [s.loss for s in ref_steps]
