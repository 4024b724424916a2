"""The run's rollout and selection policies' YAML models (`run.rollout`, `run.select`):
defaults, and the validation of their fields in a MEG that names them. What each policy
does, and what it finds wrong with a MEG, is tested in tests/policies/."""

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


def test_named_policies_load_with_their_parameters(base: dict[str, Any], tmp_path: Path) -> None:
    base["run"] = {
        "rollout": {"policy": "april", "over_provision": 0.5, "max_carry": 2},
        "select": {"policy": "greso", "explore": 0.25, "floor": 0.05, "history": 3},
    }
    run = load(base, tmp_path).run
    assert run.rollout == AprilRollout(policy="april", over_provision=0.5, max_carry=2)
    assert run.rollout.carries and run.rollout.carry_limit == 2
    assert run.select == GresoSelect(policy="greso", explore=0.25, floor=0.05, history=3)


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


def test_rollverify_and_darts_load_with_their_parameters(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"rollout": {"policy": "rollverify", "every": 2}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == RollVerify(policy="rollverify", every=2) and not rollout.carries
    base["run"] = {"rollout": {"policy": "darts"}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == DartsRollout(policy="darts", over_sample=0.5) and not rollout.carries


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
    base["run"] = {"select": {"policy": "bandit", "replays": 0.5}}
    err = refused(base, tmp_path)
    assert err.field == "run.select.bandit.replays"
    base["run"] = {"select": {"policy": "bandit", "replay": 1.5}}
    assert refused(base, tmp_path).field == "run.select.bandit.replay"


def test_sera_loads_and_a_misspelt_or_impossible_parameter_names_itself(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"select": {"policy": "sera", "base": 3}}
    assert load(base, tmp_path).run.select == SeraSelect(policy="sera", base=3)
    base["run"] = {"select": {"policy": "sera", "max_episode": 3}}
    assert refused(base, tmp_path).field == "run.select.sera.max_episode"
    base["run"] = {"select": {"policy": "sera", "base": 4, "max_episodes": 2}}
    assert "must be at least base (4)" in str(refused(base, tmp_path))


def test_srt_loads_and_a_misspelt_parameter_names_itself(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["run"] = {"rollout": {"policy": "srt", "draft": 6}}
    rollout = load(base, tmp_path).run.rollout
    assert rollout == SpeculativeRollout(policy="srt", draft=6, match=3, history=16)
    base["run"] = {"rollout": {"policy": "srt", "drafts": 6}}
    assert refused(base, tmp_path).field == "run.rollout.srt.drafts"
