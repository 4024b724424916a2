"""Size limits: how much a MEG may ask of one run, checked before anything starts.

Each limit stands in front of something that would otherwise fail late or never return,
with a traceback or an out-of-memory kill instead of an error naming the field:

- ``MAX_GROUP`` (a node's or an exchange's ``n``): samples per invocation. A chain of
  ``per_sample`` nodes multiplies them, hence also ``MAX_STEP_SAMPLES``.
- ``MAX_ROUNDS`` (an exchange's ``rounds``) and ``MAX_NODES``: an exchange unrolls into
  ``len(agents)·rounds`` nodes, in memory, during validation itself.
- ``MAX_STEP_SAMPLES``: ``episodes_per_step`` × the samples of one episode. The driver
  plans every invocation of a step, the scheduler holds its tasks and the MEG Store one
  segment per node and micro-batch; past a million samples a step, use more steps.
- ``MAX_WINDOW`` (``run.window``, ``--window``): steps compiled ahead into the task graph;
  each is held by the scheduler until it finishes.
- ``MAX_REWARD_PROCESSES`` (``run.scoring.processes``): reward processes per worker.
- ``MAX_DATASET`` (``dataset.train_size``, ``eval_size``): a generator builds the tasks in
  memory before the first step.
- ``MAX_TIMEOUT_S`` (a reward's ``timeout_s``, ``run.scoring.timeout_s``): a day. The wait
  is a ``select`` whose timeout must fit the platform's ``time_t`` (1e300 s raised
  ``OverflowError`` inside the first scoring task).
- ``MAX_SEED`` (``run.seed``, ``dataset.seed``, ``--seed``): 0 to 2³²-1, what every seeded
  generator here accepts (NumPy's legacy seeding stops at 2³²-1, none takes a negative).

``max_tokens`` has no limit here: every rollout engine clamps it to what the model's
context leaves after the prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meg.spec import MEGSpec

MAX_GROUP = 1024
MAX_ROUNDS = 100
MAX_NODES = 1000
MAX_STEP_SAMPLES = 1_000_000
MAX_WINDOW = 64
MAX_REWARD_PROCESSES = 64
MAX_DATASET = 10_000_000
MAX_TIMEOUT_S = 86_400.0
MAX_SEED = 2**32 - 1


def episode_samples(spec: MEGSpec) -> dict[str, int]:
    """Samples of each node in one episode, counted without expanding it: a node with a
    `per_sample` driver is invoked once per driver sample, any other node once; each
    invocation makes `n` samples. Equal to `expand_episode`'s counts (tested)."""
    from meg.fanout import PER_SAMPLE
    from meg.graph import topological_order

    out: dict[str, int] = {}
    for name in topological_order(spec):
        node = spec.nodes[name]
        drivers = [p for p, rule in node.inputs.items() if rule == PER_SAMPLE]
        out[name] = (out[drivers[0]] if drivers else 1) * node.n
    return out


def step_samples_problem(spec: MEGSpec, episodes_per_step: int) -> str | None:
    """Why a step of `episodes_per_step` episodes is too big (None: it is not)."""
    per_node = episode_samples(spec)
    total = episodes_per_step * sum(per_node.values())
    if total <= MAX_STEP_SAMPLES:
        return None
    top = sorted(per_node.items(), key=lambda kv: -kv[1])[:3]
    shown = ", ".join(f"{name} {count:,}" for name, count in top)
    return (
        f"one step would generate {total:,} samples ({episodes_per_step:,} episodes × "
        f"{sum(per_node.values()):,} samples each; most from {shown}); the limit is "
        f"{MAX_STEP_SAMPLES:,}: lower episodes_per_step or the nodes' n, or use more steps"
    )


def context_problems(spec: MEGSpec, contexts: dict[str, int]) -> list[tuple[str, str]]:
    """(field, why) for each node whose prompt can outgrow its model's context.

    `contexts` maps an agent to its model's context length (agents missing: unknown, not
    checked). A node's prompt shows its inputs' samples, each up to the producing node's
    `max_tokens` (what its own context leaves, at most), plus the question (its
    `question_tokens` estimate); when that alone reaches the node's context, a long enough
    sample makes the rollout fail mid-run (`PromptTooLongError`). The template's own text
    is not counted, so a refusal here is certain to be needed, never a guess.
    """
    from meg.expand import expand_episode

    def longest(node: str) -> int:
        own = spec.node_max_tokens(node)
        limit = contexts.get(spec.nodes[node].agent)
        return own if limit is None else min(own, limit - 1)

    problems = []
    for name, plans in expand_episode(spec).invocations.items():
        limit = contexts.get(spec.nodes[name].agent)
        if limit is None or not plans:
            continue
        worst = max(plans, key=lambda p: sum(len(s) * longest(q) for q, s in p.inputs))
        shown = [(q, len(s)) for q, s in worst.inputs if s]
        need = spec.dataset.question_tokens + sum(k * longest(q) for q, k in shown)
        if shown and need >= limit:
            parts = ", ".join(f"{q}: {k} × {longest(q):,}" for q, k in shown)
            problems.append(
                (
                    f"nodes.{name}.inputs",
                    f"the prompt can reach {need:,} tokens (question ~"
                    f"{spec.dataset.question_tokens}, shown samples × their max_tokens: "
                    f"{parts}), but agent {spec.nodes[name].agent!r} has a {limit:,}-token "
                    "context; lower the shown nodes' max_tokens, or show fewer samples",
                )
            )
    return problems
