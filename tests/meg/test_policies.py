"""The run's rollout and selection policies (`run.rollout`, `run.select`): defaults, the
validation of a MEG that names them, and the small pure methods the orchestrator calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from meg import MEGError, load_meg
from meg.policies import (
    AllPrompts,
    AprilRollout,
    BanditSelect,
    DartsRollout,
    FullRollout,
    GresoSelect,
    RollVerify,
    SeraSelect,
    SpeculativeRollout,
    keep_draw,
)
from workloads.rewards import known_rewards

KNOWN = ("exact_answer", "verdict")


def load(data: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_meg(path, known_rewards=KNOWN)


def refused(data: dict[str, Any], tmp_path: Path) -> MEGError:
    with pytest.raises(MEGError) as ei:
        load(data, tmp_path)
    assert str(tmp_path / "meg.yaml") in str(ei.value)
    return ei.value


def test_defaults_are_full_rollouts_of_all_prompts(base: dict[str, Any], tmp_path: Path) -> None:
    run = load(base, tmp_path).run
    assert run.rollout == FullRollout() and run.select == AllPrompts()
    assert not run.rollout.carries and run.rollout.carry_limit == 0
    assert [run.rollout.launched(q) for q in range(5)] == list(range(5))
    assert [run.rollout.quota(n) for n in range(5)] == list(range(5))
    assert not run.select.needs_history
    assert {run.select.rollout_probability(s) for s in range(10)} == {1.0}


def test_named_policies_load_with_their_parameters(base: dict[str, Any], tmp_path: Path) -> None:
    base["run"] = {
        "rollout": {"policy": "april", "over_provision": 0.5, "max_carry": 2},
        "select": {"policy": "greso", "explore": 0.25, "floor": 0.05, "history": 3},
    }
    run = load(base, tmp_path).run
    assert run.rollout == AprilRollout(policy="april", over_provision=0.5, max_carry=2)
    assert run.rollout.carries and run.rollout.carry_limit == 2
    assert run.select == GresoSelect(policy="greso", explore=0.25, floor=0.05, history=3)
    assert run.select.needs_history


@pytest.mark.parametrize(
    ("section", "value", "known"),
    [
        ("rollout", {"policy": "partial"}, "'full', 'april', 'rollverify', 'darts'"),
        ("select", {"policy": "grpo"}, "'all', 'greso', 'bandit'"),
    ],
)
def test_unknown_policy_names_the_field_and_the_known_policies(
    base: dict[str, Any], tmp_path: Path, section: str, value: dict[str, Any], known: str
) -> None:
    base["run"] = {section: value}
    err = refused(base, tmp_path)
    assert err.field == f"run.{section}"
    assert repr(value["policy"]) in str(err) and known in str(err)


@pytest.mark.parametrize(
    ("section", "value", "param"),
    [
        ("rollout", {"policy": "april", "explore": 0.5}, "explore"),  # a greso parameter
        ("rollout", {"policy": "full", "over_provision": 0.5}, "over_provision"),  # april's
        ("select", {"policy": "greso", "max_carry": 2}, "max_carry"),
        ("select", {"policy": "all", "floor": 0.1}, "floor"),
    ],
)
def test_a_parameter_of_another_policy_names_the_field(
    base: dict[str, Any], tmp_path: Path, section: str, value: dict[str, Any], param: str
) -> None:
    base["run"] = {section: value}
    err = refused(base, tmp_path)
    assert err.field is not None
    assert err.field.startswith(f"run.{section}") and err.field.endswith(f".{param}")
    assert "Extra inputs are not permitted" in str(err)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"policy": "april", "over_provision": 0.0}, "over_provision"),
        ({"policy": "april", "max_carry": 0}, "max_carry"),
        ({"policy": "rollverify", "every": 0}, "every"),
        ({"policy": "darts", "over_sample": 0.0}, "over_sample"),
        ({"policy": "darts", "max_carry": 1}, "max_carry"),
    ],
)
def test_out_of_range_parameters_name_the_field(
    base: dict[str, Any], tmp_path: Path, value: dict[str, Any], param: str
) -> None:
    base["run"] = {"rollout": value}
    err = refused(base, tmp_path)
    assert err.field is not None and err.field.endswith(f".{param}")


def test_april_is_refused_on_a_graph_with_two_roots(base: dict[str, Any], tmp_path: Path) -> None:
    base["run"] = {"rollout": {"policy": "april"}}
    load(base, tmp_path)  # one root (x): accepted
    base["nodes"]["z"] = {"agent": "b", "template": "Q: {question}", "n": 2}
    err = refused(base, tmp_path)
    assert err.field == "run.rollout"
    assert "april" in str(err) and "2 nodes without inputs (x, z)" in str(err)
    assert "policy: full" in str(err)
    base["run"] = {"rollout": {"policy": "full"}}
    assert load(base, tmp_path).run.rollout == FullRollout()  # full runs any graph


OVER_PROVISION = [0.01, 0.05, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.3, 4.0]


@pytest.mark.parametrize("over", OVER_PROVISION)
def test_april_quota_inverts_launched(over: float) -> None:
    policy = AprilRollout(policy="april", over_provision=over)
    for q in range(200):
        launched = policy.launched(q)
        assert launched >= q and (launched > q or q == 0)
        assert policy.quota(launched) == q, (over, q, launched)
    for n in range(1, 120):  # fewer launched (prompts skipped): a quota that fits, at least 1
        q = policy.quota(n)
        assert 1 <= q <= n
        assert q == 1 or policy.launched(q) <= n < policy.launched(q + 1)
    assert policy.quota(0) == 0


def test_april_default_over_provision_trains_the_planned_share() -> None:
    """The defaults (25 %): 1 planned episode launches 2 and still trains 1, 5 launch 7."""
    policy = AprilRollout(policy="april")
    assert [(policy.launched(q), policy.quota(policy.launched(q))) for q in (1, 4, 5)] == [
        (2, 1),
        (5, 4),
        (7, 5),
    ]


def test_greso_rollout_probability() -> None:
    policy = GresoSelect(policy="greso", explore=0.5, floor=0.1, history=3)
    assert policy.rollout_probability(0) == 1.0  # never flat: always rolled out
    assert policy.rollout_probability(1) == 0.5
    assert policy.rollout_probability(2) == 0.25
    assert policy.rollout_probability(3) == pytest.approx(0.125)
    # 0.5 ** 4 = 0.0625 would be below the floor, but the streak is capped at `history`
    assert policy.rollout_probability(4) == policy.rollout_probability(3)
    assert policy.rollout_probability(50) == pytest.approx(0.125)
    low = GresoSelect(policy="greso", explore=0.5, floor=0.2, history=8)
    assert [low.rollout_probability(s) for s in range(5)] == [1.0, 0.5, 0.25, 0.2, 0.2]
    no_floor = GresoSelect(policy="greso", explore=0.1, floor=0.0, history=64)
    assert no_floor.rollout_probability(5) == pytest.approx(1e-5)
    assert GresoSelect(policy="greso", explore=1.0).rollout_probability(9) == 1.0


def test_keep_draw_is_a_pure_function_of_seed_step_and_index() -> None:
    draws = {
        (seed, step, index): keep_draw(seed, step, index)
        for seed in range(3)
        for step in range(4)
        for index in range(8)
    }
    assert all(0.0 <= d < 1.0 for d in draws.values())
    assert draws == {key: keep_draw(*key) for key in draws}  # same inputs, same draw
    assert len(set(draws.values())) == len(draws)  # every seed, step and index differs
    assert keep_draw(0, 1, 2) != keep_draw(0, 2, 1) != keep_draw(1, 0, 2)
    mean = sum(draws.values()) / len(draws)
    assert 0.4 < mean < 0.6  # spread over [0, 1), not stuck at one end


@pytest.mark.parametrize(
    ("section", "known"), [("rollout", "full, april"), ("select", "all, greso")]
)
def test_a_policy_block_without_its_name_says_what_is_missing(
    base: dict[str, Any], tmp_path: Path, section: str, known: str
) -> None:
    base["run"] = {section: {"over_provision": 0.5} if section == "rollout" else {}}
    err = refused(base, tmp_path)
    assert err.field == f"run.{section}"
    assert "`policy:` is missing" in str(err) and known in str(err)


def test_rollverify_and_darts_load_and_say_what_they_stop(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"rollout": {"policy": "rollverify", "every": 2}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == RollVerify(policy="rollverify", every=2)
    assert rollout.verifies and not rollout.carries and rollout.samples(4) == 4
    base["run"] = {"rollout": {"policy": "darts"}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == DartsRollout(policy="darts", over_sample=0.5)
    assert not rollout.verifies and not rollout.carries
    assert [rollout.samples(n) for n in (1, 2, 4, 8)] == [2, 3, 6, 12]
    assert not FullRollout().verifies and FullRollout().samples(4) == 4


def test_rollverify_needs_a_reward_that_judges_a_prefix(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Checked against the real registry: `exact_answer` can judge a prefix, `verdict`
    cannot; a MEG whose only reward is `verdict` is refused, naming the ones that can."""
    base["run"] = {"rollout": {"policy": "rollverify"}}
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(base))
    assert load_meg(path, known_rewards=known_rewards()).run.rollout.verifies
    base["rewards"] = {"y": {"fn": "verdict", "params": {"target": "x"}}}
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(MEGError) as ei:
        load_meg(path, known_rewards=known_rewards())
    assert ei.value.field == "run.rollout"
    assert "no node's reward can judge a prefix" in str(ei.value)
    assert "rewards that can: exact_answer" in str(ei.value)


def test_a_misspelt_echo_field_names_itself(base: dict[str, Any], tmp_path: Path) -> None:
    base["agents"]["a"]["loss"] = {"echo": {"coeff": 0.01}}
    err = refused(base, tmp_path)
    assert err.field == "agents.a.loss.echo.coeff"
    base["agents"]["a"]["loss"] = {"echo": True}
    assert load(base, tmp_path).agents["a"].loss.echo.coef == 0.001


def test_the_bandit_loads_and_a_misspelt_parameter_names_itself(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"select": {"policy": "bandit", "alpha": 0.5}}
    select = load(base, tmp_path).run.select
    assert select == BanditSelect(policy="bandit", alpha=0.5, replay=0.5, ridge=1.0)
    assert select.needs_history
    base["run"] = {"select": {"policy": "bandit", "replays": 0.5}}
    err = refused(base, tmp_path)
    assert err.field == "run.select.bandit.replays"
    base["run"] = {"select": {"policy": "bandit", "replay": 1.5}}
    assert refused(base, tmp_path).field == "run.select.bandit.replay"


def test_sera_loads_and_is_refused_where_it_cannot_act(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"select": {"policy": "sera", "base": 3}}
    select = load(base, tmp_path).run.select
    assert select == SeraSelect(policy="sera", base=3) and select.merges_groups
    assert select.needs_history and not AllPrompts().merges_groups
    base["run"] = {"select": {"policy": "sera", "max_episode": 3}}
    assert refused(base, tmp_path).field == "run.select.sera.max_episode"
    base["run"] = {"select": {"policy": "sera", "base": 4, "max_episodes": 2}}
    assert "must be at least base (4)" in str(refused(base, tmp_path))
    base["run"] = {"select": {"policy": "sera"}}
    base["rewards"] = {"y": {"fn": "exact_answer"}}  # the root x has no reward
    err = refused(base, tmp_path)
    assert err.field == "run.select" and "alone (x) from their rewards, and none has" in str(err)


def test_srt_loads_and_needs_every_agent_on_the_hf_backend(
    base: dict[str, Any], tmp_path: Path
) -> None:
    for agent in base["agents"].values():
        agent["backend"] = "hf"
    base["run"] = {"rollout": {"policy": "srt", "draft": 6}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == SpeculativeRollout(policy="srt", draft=6, match=3, history=16)
    assert rollout.speculation(64) == (6, 3, 16) and FullRollout().speculation(64) is None
    assert rollout.speculation(6) is None  # no more tokens than a draft: sampled plainly
    base["run"] = {"rollout": {"policy": "srt", "drafts": 6}}
    assert refused(base, tmp_path).field == "run.rollout.srt.drafts"
    base["run"] = {"rollout": {"policy": "srt"}}
    base["agents"]["b"]["backend"] = "vllm"
    err = refused(base, tmp_path)
    assert err.field == "run.rollout" and "(or leave `backend` out) for b" in str(err)
    del base["agents"]["b"]["backend"]  # `auto`: the run chooses hf for a drafted agent
    assert load(base, tmp_path).agents["b"].backend == "auto"
    base["agents"]["b"]["backend"] = "vllm"
    base["agents"]["b"]["sampling"] = {"max_tokens": 4}  # a verdict: sampled plainly
    assert load(base, tmp_path).agents["b"].backend == "vllm"
