"""The two protocols every policy implements, and the registries that find a policy's
behaviour by the `policy:` tag of its YAML model (`meg.policies`).

A *rollout* policy decides how a step samples: how many episodes a micro-batch launches
for those it trains (`launched`, `quota`), how a node's requests are sampled — plainly in
one batch, under a `Watch` that stops single requests (`watch`), speculatively
(`speculation`) or from a bounded KV cache (`kv_budget`) — which of an agent's samples an
external policy draws (`external`), which agents only the `hf`
engine can serve (`hf_only`), which loss anchor its samples need (`anchors`) and what is
wrong with a MEG that asks for it (`problems`).
The cut-and-carry of partial rollouts is a mechanism (`tasks.carry`) driven by the model's
`carry_limit`, a setting the consistency rule reads like the async staleness.

A *selection* policy decides which prompts a step rolls out: its `selector` plans each
step's micro-batches from the run's history and reports what it did as counts
(`SelectRef.counts`, printed and summed generically), `merges_groups` / `mean_episodes`
say how the root's advantage groups are formed, `problems` what a MEG must have for it.

The defaults here are the baselines' (`full`, `all`): a policy overrides what it changes.
Each technique is one module of this package, registered under its tag; every module of
the package not named with a leading underscore (and not this one) is a built-in, so adding
a policy is its model, its module, its test and its docs section (docs/development.md).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from engines.rollout.base import SparseKV, Speculation, Watch
from meg import MEGSpec
from meg.policies import AllPrompts, ExternalSource, FullRollout
from meg.registry import Registry
from workloads.datasets import Episode, TaskItem
from workloads.rewards import Decided

Problem = tuple[str, str]  # (the MEG field at fault, what is wrong and how to fix it)

R = TypeVar("R", bound=FullRollout)
S = TypeVar("S", bound=AllPrompts)


@dataclass(frozen=True)
class NodeRequests:
    """What a generate task knows of a node's requests when it asks for a watch."""

    n: int  # samples a prompt (the node's `n`)
    tasks: Sequence[TaskItem]  # each prompt's task
    decided: Decided | None  # the node's reward's prefix verdict (None: it has none)
    decode: Callable[[Sequence[int]], str]  # ids → the text the score reads
    tokenizer: Any = None  # a fast tokenizer's backend (incremental decoding), or None


@dataclass(frozen=True)
class Rollout(Generic[R]):
    """How a rollout policy samples; the defaults are `full`'s (every planned episode runs
    to completion, each node in one plain batch)."""

    model: R

    def launched(self, quota: int) -> int:
        """Episodes a micro-batch that trains `quota` of them launches."""
        return quota

    def quota(self, launched: int) -> int:
        """Inverse of `launched`: the episodes a micro-batch of `launched` must complete."""
        return launched

    def speculation(self, max_tokens: int) -> Speculation | None:
        """How a node of `max_tokens` drafts and verifies (None: it decodes plainly)."""
        return None

    def kv_budget(self, max_tokens: int) -> SparseKV | None:
        """The bounded KV cache a node of `max_tokens` decodes with (None: the full one)."""
        return None

    def external(self, agent: str) -> ExternalSource | None:
        """The external policy that samples some of each group of `agent`'s nodes (None:
        the agent samples all of them itself)."""
        return None

    def anchors(self, spec: MEGSpec) -> Mapping[str, str]:
        """Agent → the loss anchor (`loss.old_logprobs`) its samples need under this policy
        (a sampler that is not the dense policy needs its correction). `settle` sets it for
        an agent that names none; `problems` refuses an agent that names another."""
        return {}

    def watch(self, node: NodeRequests) -> tuple[Watch, int] | None:
        """The watch a node's requests are sampled under and the responses each group of
        `node.n` launches; None: one plain batch of `n` a prompt."""
        return None

    def hf_only(self, spec: MEGSpec) -> set[str]:
        """The agents whose nodes this policy samples with a mechanism only `hf` has."""
        return set()

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        """What is wrong with `spec` under this policy (`rewards`: the reward registry, for
        what a reward declares; None when the caller checks no reward names)."""
        return []


@dataclass(frozen=True, slots=True)
class SelectRef:
    """What selection did to one step (collected with the task results for the summary):
    the prompts it planned, and per count name the task ids it counts ("skipped": not
    rolled out; a policy may add its own, e.g. "replayed", "repeated")."""

    step: int
    planned: int
    counts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def skipped(self) -> tuple[str, ...]:
        return self.counts.get("skipped", ())


class RunView(Protocol):
    """What a selector reads of a run (a `tasks.context.RunContext` is one)."""

    @property
    def spec(self) -> MEGSpec: ...
    @property
    def seed(self) -> int: ...
    @property
    def store_url(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def storage_options(self) -> dict[str, Any] | None: ...


class Selector(Protocol):
    """Plans which episodes of a step are rolled out, from the history up to k - window."""

    def ingest(self, upto: int) -> None: ...

    def select(
        self, k: int, planned: list[tuple[Episode, ...]]
    ) -> tuple[list[tuple[Episode, ...]], SelectRef]: ...


@dataclass(frozen=True)
class Selection(Generic[S]):
    """How a selection policy plans; the defaults are `all`'s (every planned prompt, one
    advantage group per invocation)."""

    model: S
    # the step planner's type, built as `(model, run, window, task_of, item_of)`; None: the
    # planned prompts as they are
    planner: ClassVar[Callable[..., Selector] | None] = None

    @property
    def needs_history(self) -> bool:
        """Whether it plans from the run's history (then a resumed run re-plans its earlier
        steps first, to make the same choices)."""
        return self.planner is not None

    def selector(
        self,
        run: RunView,
        window: int,
        task_of: Callable[[str], str | None],
        item_of: Callable[[str], TaskItem],
    ) -> Selector | None:
        """The step planner, reading the history up to k - window (`policies._history`)."""
        if self.planner is None:
            return None
        return self.planner(self.model, run, window, task_of, item_of)

    @property
    def merges_groups(self) -> bool:
        """Whether a root node's groups of one prompt's episodes in one step are one
        advantage group (a prompt given several episodes)."""
        return False

    @property
    def mean_episodes(self) -> int:
        """Episodes a prompt gets on average in a micro-batch."""
        return 1

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        return []


def _modules() -> tuple[str, ...]:
    """Every policy module of this package (not this one, none starting with `_`)."""
    here = Path(__file__).parent
    return tuple(
        f"{__package__}.{m.name}"
        for m in pkgutil.iter_modules([str(here)])
        if not m.name.startswith("_") and m.name != "base"
    )


BUILTINS = _modules()  # each registers its policy in one of the two registries below
ROLLOUTS: Registry[type[Rollout[Any]]] = Registry("rollout policy", builtins=BUILTINS)
SELECTIONS: Registry[type[Selection[Any]]] = Registry("selection policy", builtins=BUILTINS)
