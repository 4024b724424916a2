"""Every user mistake gives a MEGError naming the file and field, with a useful message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from meg import MEGError, build_spec, load_meg, validate

KNOWN = ("exact_answer", "verdict")


def check(data: dict[str, Any], tmp_path: Path, **kw: Any) -> MEGError:
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MEGError) as ei:
        load_meg(path, known_rewards=KNOWN, **kw)
    assert str(path) in str(ei.value)
    return ei.value


def test_valid_base_loads(base: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(base))
    spec = load_meg(path, known_rewards=KNOWN)
    assert list(spec.nodes) == ["x", "y"]
    assert spec.nodes["y"].inputs == {"x": "per_sample"}


def test_cycle_prints_path(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["x"]["inputs"] = {"y": "all"}
    base["nodes"]["x"]["template"] = "{y}"
    err = check(base, tmp_path)
    assert "cycle" in str(err) and ("x -> y -> x" in str(err) or "y -> x -> y" in str(err))


def test_unknown_agent_lists_known(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["y"]["agent"] = "zed"
    err = check(base, tmp_path)
    assert err.field == "nodes.y.agent" and "'zed'" in str(err) and "a, b" in str(err)


def test_unknown_input_node(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["y"]["inputs"] = {"nope": "all"}
    err = check(base, tmp_path)
    assert err.field == "nodes.y.inputs" and "'nope'" in str(err)


def test_duplicate_name_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        "name: t\nagents:\n  a: {model: hf://o/m}\n  a: {model: hf://o/m}\n"
        "nodes:\n  x: {agent: a, template: hi}\n"
    )
    with pytest.raises(MEGError, match=r"duplicate name 'a' \(line 4\)") as ei:
        load_meg(path)
    assert str(path) in str(ei.value)


def test_duplicate_name_from_exchange(tmp_path: Path) -> None:
    data = {
        "name": "t",
        "agents": {"a": {"model": "hf://o/m"}, "b": {"model": "hf://o/m"}},
        "nodes": {"a@1": {"agent": "a", "template": "hi"}},
        "exchanges": {"d": {"agents": ["a", "b"], "first_template": "q", "reply_template": "r"}},
    }
    err = check(data, tmp_path)
    assert "duplicate node name 'a@1'" in str(err)


def test_placeholder_not_a_parent(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["y"]["template"] = "{x} and {z}"
    err = check(base, tmp_path)
    assert err.field == "nodes.y.template" and "{z}" in str(err) and "[x]" in str(err)


def test_a_node_named_question_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    """`{question}` always renders the task, so a node of that name could never be read."""
    base["nodes"]["question"] = base["nodes"].pop("x")
    base["nodes"]["y"]["inputs"] = {"question": "per_sample"}
    err = check(base, tmp_path)
    assert err.field == "nodes.question" and "reserved placeholder" in str(err)


def test_n_below_one(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["x"]["n"] = 0
    err = check(base, tmp_path)
    assert err.field == "nodes.x.n" and "at least 1" in str(err)


def test_unknown_reward_lists_known(base: dict[str, Any], tmp_path: Path) -> None:
    base["rewards"]["x"]["fn"] = "magic"
    err = check(base, tmp_path)
    assert err.field == "rewards.x.fn" and "'magic'" in str(err)
    assert "exact_answer, verdict" in str(err)


def test_unknown_fanout_lists_known(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["y"]["inputs"] = {"x": "sometimes"}
    err = check(base, tmp_path)
    assert err.field == "nodes.y.inputs.x" and "per_sample, all, best, first" in str(err)


def test_two_drivers(base: dict[str, Any], tmp_path: Path) -> None:
    base["nodes"]["z"] = {
        "agent": "a",
        "template": "{x}{y}",
        "inputs": {"x": "per_sample", "y": "per_sample"},
    }
    err = check(base, tmp_path)
    assert "at most one input" in str(err)


def test_missing_model_path(base: dict[str, Any], tmp_path: Path) -> None:
    base["agents"]["a"]["model"] = str(tmp_path / "no-such-model")
    err = check(base, tmp_path)
    assert err.field == "agents.a.model" and "no-such-model" in str(err)
    assert "flexmarl tiny-model" in str(err)


def test_unknown_key_is_rejected(base: dict[str, Any], tmp_path: Path) -> None:
    base["agents"]["a"]["sampling"] = {"max_token": 3}
    err = check(base, tmp_path)
    assert err.field == "agents.a.sampling.max_token"


def test_reward_on_unknown_node(base: dict[str, Any], tmp_path: Path) -> None:
    base["rewards"]["ghost"] = {"fn": "exact_answer"}
    assert check(base, tmp_path).field == "rewards.ghost"


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(MEGError, match="no such file"):
        load_meg(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: [unclosed")
    with pytest.raises(MEGError, match="not valid YAML"):
        load_meg(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(MEGError, match="must be a YAML mapping"):
        load_meg(lst)


def test_dataset_needs_exactly_one_source(base: dict[str, Any]) -> None:
    base["dataset"] = {"generator": "arithmetic", "url": "file:///x.jsonl"}
    with pytest.raises(MEGError, match="exactly one of"):
        validate(build_spec(base))


LOSSES = {"advantage": ["grpo", "rloo"], "policy_loss": ["grpo"], "old_logprobs": ["recompute"]}


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"loss": {"advantage": "grpoo"}}, "agents.a.loss.advantage", "known: grpo, rloo"),
        ({"loss": {"old_logprobs": "x"}}, "agents.a.loss.old_logprobs", "known: recompute"),
        ({"lora": {"r": 0}}, "agents.a.lora.r", "greater than or equal to 1"),
        ({"lora": {"rank": 8}}, "agents.a.lora.rank", "Extra inputs are not permitted"),
        ({"lora": {"target_modules": "all"}}, "agents.a.lora.target_modules", "all-linear"),
        ({"placement": {"train_slot": "cuda:1"}}, "agents.a", "`placement` is not an agent field"),
        ({"loss": {"clip_eps_high": 1.5}}, "agents.a.loss", "below 1"),
        ({"loss": {"dual_clip": 1.0}}, "agents.a.loss.dual_clip", "greater than 1"),
        ({"sampling": {"temperature": 0}}, "agents.a.sampling.temperature", "greater than 0"),
        ({"dtype": "float16"}, "agents.a.dtype", "float32"),
    ],
)
def test_agent_fields_are_honoured_or_rejected(
    base: dict[str, Any], tmp_path: Path, patch: dict[str, Any], field: str, words: str
) -> None:
    base["agents"]["a"].update(patch)
    err = check(base, tmp_path, known_losses=LOSSES)
    assert err.field == field and words in str(err)


def test_grad_clip_zero_disables_clipping_and_validates(
    base: dict[str, Any], tmp_path: Path
) -> None:
    base["agents"]["a"]["optim"] = {"grad_clip": 0}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(base))
    spec = load_meg(path, known_rewards=KNOWN, known_losses=LOSSES)
    assert spec.agents["a"].optim.grad_clip == 0


def test_train_config_takes_every_spec_field() -> None:
    """One source of truth: every optim/loss field reaches the trainer, by name."""
    from engines.training.trainer import TrainConfig
    from meg.agent_spec import AgentSpec, LossSpec, OptimSpec

    agent = AgentSpec(
        model="m",
        dtype="bfloat16",
        sampling={"temperature": 0.7},
        optim={"lr": 3e-4, "grad_clip": 0.0},
        loss={"kl_coef": 0.05, "dual_clip": 3.0, "old_logprobs": "behaviour", "is_cap": 4.0},
    )
    cfg = TrainConfig.from_agent(agent, seed=7)
    for name in [*OptimSpec.model_fields, *LossSpec.model_fields]:
        if name in ("echo", "credit"):  # the driver's: echo clips, a loop's turn credit
            continue
        spec_value = getattr(agent.optim if name in OptimSpec.model_fields else agent.loss, name)
        assert getattr(cfg, name) == (tuple(spec_value) if name == "betas" else spec_value), name
    assert (cfg.temperature, cfg.dtype, cfg.seed) == (0.7, "bfloat16", 7)
    echo = AgentSpec(model="m", loss={"echo": {"coef": 0.02}})
    assert TrainConfig.from_agent(echo).echo_coef == 0.02


def test_a_default_agent_is_a_default_train_config() -> None:
    """TrainConfig's defaults are the spec's, written once: an agent with nothing set maps
    to `TrainConfig()` exactly."""
    from engines.training.trainer import TrainConfig
    from meg.spec import AgentSpec

    assert TrainConfig.from_agent(AgentSpec(model="m")) == TrainConfig()


def test_lora_spec_reaches_the_trainer_field_by_field() -> None:
    from engines.training.lora import LoraConfig
    from engines.training.trainer import TrainConfig
    from meg.agent_spec import AgentSpec, LoraSpec

    lora = {"r": 4, "alpha": 8.0, "dropout": 0.1, "target_modules": ["q_proj"]}
    cfg = TrainConfig.from_agent(AgentSpec(model="m", lora=lora))
    assert cfg.lora == LoraConfig(r=4, alpha=8.0, dropout=0.1, target_modules=("q_proj",))
    assert set(LoraSpec.model_fields) == {"r", "alpha", "dropout", "target_modules"}
    default = TrainConfig.from_agent(AgentSpec(model="m", lora=True)).lora
    assert default == LoraConfig(r=8, alpha=16.0, dropout=0.0, target_modules=None)
    assert TrainConfig.from_agent(AgentSpec(model="m", lora=False)).lora is None
    assert TrainConfig.from_agent(AgentSpec(model="m")).lora is None
