"""The typed MEG spec: what a user writes in YAML, validated by pydantic.

The models are frozen and forbid unknown keys, so a typo (`max_token:`) is an error that names
the field instead of a silently ignored setting. Prefect renders these same models as the
deployment form in its UI, which is why the user-facing config is pydantic and not dataclasses.

Cross-field rules (unknown agent, cycle, template placeholder that is not a parent, ...) live
in `meg.validate`, because they need the whole graph and the registries of the caller.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from meg.agent_spec import AgentSpec
from meg.agentic_spec import CallSpec, LoopSpec, ToolSpec, TurnOf, WhenSpec
from meg.frozen import Frozen
from meg.limits import (
    MAX_DATASET,
    MAX_GROUP,
    MAX_ROUNDS,
    MAX_SEED,
)
from meg.run_spec import RunSpec

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_@\-]*$")


class ChatSpec(Frozen):
    """Render a node's prompt with its tokenizer's chat template (for instruct models).

    `user` is the user message — a template like `template`, with `{question}` and the
    node's inputs (give it here or as the node's `template`, not both); `system` is a fixed
    system message. The framing the chat template adds around the user message is encoded
    as text; the user message is rendered as any template is, parents' responses spliced
    in as the token ids they sampled (token-in/token-out is kept)."""

    system: str | None = Field(None, description="Fixed system message (no placeholders).")
    user: str | None = Field(None, description="User message template (else `template`).")


class NodeSpec(Frozen):
    """One invocation of one agent per (episode, fan-out branch), producing `n` samples.

    `inputs` maps a parent node to its fan-out rule: `per_sample` runs this node once per
    sample of that parent (a tree); `all`, `first` and `best` run it once over an aggregate of
    that parent's samples. At most one input may be `per_sample`: it drives the fan-out.
    """

    agent: str = Field(
        "",
        description="The agent that samples this node; for a tool node, the agent whose "
        "table holds its rows (default: its driver input's agent).",
    )
    template: str = Field(
        "",
        description="Prompt template: `{question}` and the inputs' names (with `chat`: the "
        "user message). Not for a tool node.",
    )
    n: int = Field(1, description="Samples per invocation: the GRPO group size.")
    max_tokens: int | None = Field(None, ge=1)
    inputs: dict[str, str] = Field(default_factory=dict)
    chat: ChatSpec | None = Field(
        None, description="Wrap the prompt in the tokenizer's chat template."
    )
    tool: ToolSpec | None = Field(
        None, description="Run this registered tool instead of an LLM call (an environment step)."
    )
    when: list[WhenSpec] = Field(
        default_factory=list,
        description="Run an invocation only when every condition holds; else its rows are "
        "stored as `skipped`.",
    )
    turn: TurnOf | None = Field(None, description="Set by loop unrolling (not by hand).")

    @model_validator(mode="after")
    def _kind(self) -> NodeSpec:
        """An LLM node names an agent and a template; a tool node has neither a template nor
        sampling fields (its one output per invocation is the tool's)."""
        if self.tool is None:
            if not self.agent:
                raise ValueError("a node needs an `agent` (or a `tool`)")
            if not self.template:
                raise ValueError("a node needs a `template` (or a `tool`)")
            return self
        extra = [f for f in ("template", "max_tokens", "chat") if getattr(self, f)]
        if extra or self.n != 1:
            what = ", ".join(extra) or f"n = {self.n}"
            raise ValueError(f"a tool node runs its tool once per invocation; remove {what}")
        if not self.inputs:
            raise ValueError("a tool node reads its inputs' samples; give it `inputs`")
        return self

    @property
    def is_tool(self) -> bool:
        return self.tool is not None

    @model_validator(mode="before")
    @classmethod
    def _user_is_the_template(cls, data: Any) -> Any:
        """`chat: {user: ...}` is the node's template; giving both is ambiguous."""
        if not isinstance(data, dict):
            return data
        chat = data.get("chat")
        user = chat.get("user") if isinstance(chat, dict) else getattr(chat, "user", None)
        if user is None:
            return data
        if "template" in data and data["template"] != user:
            raise ValueError("give the prompt once: either `template` or `chat.user`")
        return {**data, "template": user}

    @field_validator("n")
    @classmethod
    def _n_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"n must be at least 1 (got {v}); it is the number of samples")
        if v > MAX_GROUP:
            raise ValueError(f"n must be at most {MAX_GROUP} (got {v}): the group-size limit")
        return v


class RewardSpec(CallSpec):
    """A registered reward function bound to a node; `params` are passed as keywords."""

    fn: str = Field(description="A registered reward name, or `module:function` of your own.")


class ExchangeSpec(Frozen):
    """A multi-turn exchange between agents, unrolled into nodes `{agent}@{round}`.

    Round 1 uses `first_template`; round r > 1 uses `reply_template`, where `{self}` is the
    agent's own previous turn (per-sample: each of its samples continues its own thread) and
    `{other}` is the other agents' previous turns (aggregated with `other_fanout`).

    `inputs` lets the exchange follow upstream nodes ("critics debate about a proposal"):
    both templates may show them by name, with a fan-out rule as any node's inputs. Round 1
    uses the rules as written (`per_sample`: one exchange per upstream sample); a later
    turn already descends from its thread's upstream sample through `{self}`, so a
    `per_sample` input is shown there as `first` of the same lineage — that very sample.
    """

    agents: list[str] = Field(min_length=2)
    rounds: int = Field(2, ge=1, le=MAX_ROUNDS)
    n: int = Field(1, ge=1, le=MAX_GROUP)
    first_template: str
    reply_template: str
    other_fanout: str = "first"
    max_tokens: int | None = Field(None, ge=1)
    inputs: dict[str, str] = Field(
        default_factory=dict,
        description="Upstream nodes the turns may show, with fan-out rules (as a node's).",
    )
    chat: ChatSpec | None = Field(
        None, description="Render the turns with the tokenizer's chat template (as a node's)."
    )


class DatasetSpec(Frozen):
    """Either a registered synthetic `generator` or a JSONL/Parquet file at any fsspec `url`."""

    generator: str | None = Field(
        None, description="A registered generator name, or `module:function` of your own."
    )
    params: dict[str, Any] = Field(default_factory=dict)
    url: str | None = None
    question_field: str = "question"
    answer_field: str = "answer"
    train_size: int = Field(512, ge=1, le=MAX_DATASET)
    eval_size: int = Field(64, ge=0, le=MAX_DATASET)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    question_tokens: int = Field(16, ge=1, description="A question's tokens (estimate; KV sizing).")


class MEGSpec(Frozen):
    """A whole multi-agent execution graph with its rewards, data and run defaults."""

    name: str
    description: str = ""
    plugins: list[str] = Field(
        default_factory=list,
        description="Modules of your own to import before validation and on every worker: "
        "a `.py` file or package directory next to the MEG (`my_rewards`, `my_rewards.py`), "
        "or an installed module name. Their `@register_reward` / `@register_generator` "
        "names, or `module:function` names, can then be used in `rewards` and `dataset`.",
    )
    agents: dict[str, AgentSpec]
    nodes: dict[str, NodeSpec] = Field(default_factory=dict)
    exchanges: dict[str, ExchangeSpec] = Field(default_factory=dict)
    loops: dict[str, LoopSpec] = Field(
        default_factory=dict,
        description="Bounded loops, unrolled into nodes `{body}@{round}` (`meg.loops`).",
    )
    rewards: dict[str, RewardSpec] = Field(default_factory=dict)
    team_nodes: list[str] | None = Field(
        None, description="Nodes whose mean reward is the team reward; default: the sinks."
    )
    dataset: DatasetSpec = DatasetSpec(generator="arithmetic")
    run: RunSpec = RunSpec()

    def with_run(self, **values: Any) -> MEGSpec:
        """This spec with run settings replaced, validated as a MEG's `run:` would be."""
        run = RunSpec.model_validate(self.run.model_dump() | values)
        return self.model_copy(update={"run": run})

    def node_max_tokens(self, node: str) -> int:
        """A node's response budget; 0 for a tool node (it decodes nothing)."""
        spec = self.nodes[node]
        if spec.is_tool:
            return 0
        return spec.max_tokens or self.agents[spec.agent].sampling.max_tokens
