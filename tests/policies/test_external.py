"""`external` (external-policy rollouts): each listed agent's groups take `rows` samples
from a frozen model or a teammate, with the loss anchor that corrects for them (given by the
run to an agent that names none); `meg validate` names a misspelt or impossible setting:
an unknown agent, an agent as its own source, a teammate with another tokenizer, a source
naming both or neither, no own sample left in a group, and an agent naming another anchor.
The frozen model's vocabulary is checked when its host is built."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engines.rollout.base import RolloutError, SamplingParams
from meg.policies import ExternalRollout, ExternalSource
from policies import implied, rollout_policy
from tasks.external import check_vocabulary, external_row, split
from tests.policies.conftest import load, refused


def external(base: dict[str, Any], **sources: Any) -> dict[str, Any]:
    base["run"] = {"rollout": {"policy": "external", "sources": sources}}
    return base


def test_external_loads_and_says_which_agents_draw_from_whom(
    base: dict[str, Any], tmp_path: Path
) -> None:
    spec = load(external(base, a={"model": "models/strong"}, b={"agent": "a"}), tmp_path)
    assert isinstance(spec.run.rollout, ExternalRollout)
    policy = rollout_policy(spec)
    assert policy.external("a") == ExternalSource(model="models/strong", rows=1)
    assert policy.external("b") == ExternalSource(agent="a", rows=1)
    assert policy.external("c") is None
    assert policy.anchors(spec) == {"a": "external", "b": "external"}
    assert policy.hf_only(spec) == set()  # both engines sample an external policy


def test_a_misspelt_or_ambiguous_source_names_its_field(
    base: dict[str, Any], tmp_path: Path
) -> None:
    err = refused(external(base, a={"modle": "m"}), tmp_path)
    assert err.field == "run.rollout.external.sources.a.modle"
    both = refused(external(base, a={"model": "m", "agent": "b"}), tmp_path)
    assert "exactly one of `model`" in str(both)
    assert "exactly one of `model`" in str(refused(external(base, a={"rows": 1}), tmp_path))
    assert "rows" in str(refused(external(base, a={"agent": "b", "rows": 0}), tmp_path))
    assert "sources" in str(refused(external(base), tmp_path))  # none listed


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ({"c": {"agent": "a"}}, "'c' is not an agent of this MEG (agents: a, b)"),
        ({"a": {"agent": "z"}}, "a: the external agent 'z' is not an agent of this MEG"),
        ({"a": {"agent": "a"}}, "a: an agent is not an external policy of itself"),
        ({"a": {"agent": "b", "rows": 2}}, "leave no sample of the agent's own in the groups of x"),
    ],
)
def test_an_impossible_source_is_refused(
    base: dict[str, Any], tmp_path: Path, sources: dict[str, Any], message: str
) -> None:
    err = refused(external(base, **sources), tmp_path)
    assert err.field == "run.rollout.sources" and message in str(err)


def test_a_teammate_with_another_tokenizer_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    base["agents"]["b"]["tokenizer"] = "hf://org/other"
    err = refused(external(base, a={"agent": "b"}), tmp_path)
    assert "the external agent 'b' has another tokenizer" in str(err)


def test_an_agent_naming_another_anchor_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    data = external(base, a={"agent": "b"})
    data["agents"]["a"]["loss"] = {"old_logprobs": "recompute"}
    err = refused(data, tmp_path)
    assert "drop `old_logprobs` from `loss:` (the run sets it) or set `external`" in str(err)


def test_an_agent_naming_no_anchor_is_given_the_correction(
    base: dict[str, Any], tmp_path: Path
) -> None:
    spec = load(external(base, b={"agent": "a"}), tmp_path)
    done, sources, notes = implied(spec)
    assert {n: s.loss.old_logprobs for n, s in done.agents.items()} == {
        "a": "recompute",  # draws from no external policy
        "b": "external",
    }
    assert sources == {"agents.b.loss.old_logprobs": "policy"}
    assert notes == [
        "agent b: loss anchor external (what the external rollout policy's samples need)"
    ]


def test_a_group_is_split_into_own_and_external_draws_with_their_own_seeds() -> None:
    params = SamplingParams(n=8, max_tokens=4, seed=7)
    own, drawn = split(params, ExternalSource(agent="b", rows=3))
    assert (own.n, drawn.n) == (5, 3) and own.seed == 7 and drawn.seed != 7
    assert split(params, ExternalSource(model="m", rows=3))[1].seed != drawn.seed
    row = external_row({"policy_version": 4, "source": ""}, "agent:b@v2")
    assert row == {"policy_version": -1, "source": "agent:b@v2"}


def test_a_frozen_model_with_another_vocabulary_is_refused(tiny_model: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.add_tokens(["<an-extra-token>"])
    tok.save_pretrained(other)
    agents = {"a": SimpleNamespace(tokenizer_path=tiny_model)}
    ctx: Any = SimpleNamespace(spec=SimpleNamespace(agents=agents))
    check_vocabulary(ctx, "a", tiny_model)  # the same: fine
    with pytest.raises(RolloutError, match=f"the external model {other} does not share"):
        check_vocabulary(ctx, "a", str(other))
