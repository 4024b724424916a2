"""The score task with a reward that raises on one sample of a group and hangs on another:
both are `failed` in the store with their reason, scored by the failure rule, and the task
finishes (it used to fail, and a hang used to hang it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meg.spec import RewardSpec
from tasks.accounting import read_scored
from tasks.context import RunContext
from tasks.refs import Episode, RewardSum
from tasks.scoring import score_rows
from tasks.worker import store_of
from tests.tasks.conftest import math_chain
from tests.tasks.test_scoring import SOLVE_CORRECT, commit_rows, group_of, solver_answers

FLAKY = '''
import time

from workloads.rewards import reward


@reward(reads=lambda params: ())
def flaky(sample, episode, task, **_):
    """Sample 1 of each group raises, sample 2 of the first episode hangs, the rest are
    judged by their answer."""
    episode_id, _, _, i = sample.id.split("/")
    if i == "1":
        raise ConnectionError("judge service unavailable")
    if i == "2" and episode_id.endswith("e0"):
        time.sleep(600)
    return float(sample.text.strip() == task.answer)
'''


@pytest.fixture
def flaky_ctx(
    new_ctx, tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> RunContext:
    path = tmp_path / "flaky_rewards.py"
    path.write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))  # as the plug-in shipping does on a worker

    def make(rule: str) -> RunContext:
        spec = math_chain(tiny_model, n=4)
        scoring = spec.run.scoring.model_copy(update={"on_failure": rule, "timeout_s": 3.0})
        spec = spec.model_copy(
            update={
                "plugins": [str(path)],
                "rewards": {**spec.rewards, "solve": RewardSpec(fn="flaky_rewards:flaky")},
                "run": spec.run.model_copy(update={"scoring": scoring}),
            }
        )
        return new_ctx(rule, spec=spec)

    return make


def score_solve(ctx: RunContext) -> tuple[object, dict[str, tuple[float, float, str]]]:
    from tasks.refs import episode_id
    from workloads.datasets import load_dataset

    train = load_dataset(ctx.spec.dataset).train
    episodes: tuple[Episode, ...] = tuple((episode_id(0, i), train[i]) for i in range(2))
    commit_rows(ctx, "solve", 0, 0, episodes, solver_answers)
    ref = score_rows(ctx, 0, 0, episodes, group_of(ctx, "solve"))[0]
    b = store_of(ctx).table("solver").read(step=0, node="solve", micro_batch=0)
    rows = {
        str(s): (float(r), float(a), str(st))
        for s, r, a, st in zip(b.sample_id, b.reward, b.advantage, b.score_status, strict=True)
    }
    return ref, rows


def test_zero_rule(flaky_ctx) -> None:
    ctx = flaky_ctx("zero")
    ref, rows = score_solve(ctx)
    assert rows["k0e0/solve/0/1"][2] == "failed: ConnectionError: judge service unavailable"
    assert rows["k0e0/solve/0/2"][2] == "failed: timed out after 3 s"
    assert rows["k0e1/solve/0/1"][2].startswith("failed: ConnectionError")
    ok = [s for s, r in rows.items() if r[2] == "ok"]
    assert sorted(ok) == [
        "k0e0/solve/0/0",
        "k0e0/solve/0/3",
        "k0e1/solve/0/0",
        "k0e1/solve/0/2",
        "k0e1/solve/0/3",
    ]
    for e, eid in enumerate(("k0e0", "k0e1")):
        ids = [f"{eid}/solve/0/{i}" for i in range(4)]
        rewards = [rows[s][0] for s in ids]
        want = [
            c if rows[s][2] == "ok" else 0.0 for s, c in zip(ids, SOLVE_CORRECT[e], strict=True)
        ]
        assert rewards == want  # a failed sample is scored 0 ...
        adv = np.asarray([rows[s][1] for s in ids])
        assert adv.sum() == pytest.approx(0.0, abs=1e-5)  # ... and its group as usual
    assert ref.failed == {"solver": 3}
    assert ref.agent_reward == {"solver": RewardSum(2.0, 8)}  # the zeros count
    batch, _ = read_scored(ctx, "solver", 0, 0)  # trainable
    assert np.isfinite(batch.advantage).all()


def test_drop_group_rule(flaky_ctx) -> None:
    ctx = flaky_ctx("drop_group")
    ref, rows = score_solve(ctx)
    for s, (r, a, st) in rows.items():
        i = s.rsplit("/", 1)[1]
        assert a == 0.0  # every group had a failure: no signal anywhere
        if i == "1" or s == "k0e0/solve/0/2":
            assert st.startswith("failed: ") and np.isnan(r)
        else:
            assert st == "dropped: a reward call of its group failed" and not np.isnan(r)
    assert ref.failed == {"solver": 3}
    assert ref.agent_reward["solver"].count == 5  # the NaN rewards are left out of means
    batch, _ = read_scored(ctx, "solver", 0, 0)
    assert np.isfinite(batch.advantage).all()
