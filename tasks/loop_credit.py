"""Per-turn advantages of a loop's rounds, from the rows of one score task.

The rounds of one loop body node (`code@1`, `code@2`, ...) are one agent's turns. The
agent's `loss.credit` (`engines.training.turn_credit`) turns their rewards into advantages
across the loop, over the rollouts of one prompt: the *group* of a row is the invocation of
the loop's entry at round 1 its lineage descends from (the prompt's `n` rollouts), its
*parent* the same body node's sample of the round before, and its *state* the round and
the tool observations its lineage made before it acted (what CRBC merges across
rollouts). Skipped rows are not turns: a row whose next round was not taken is final.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from engines.training.catalog import WHOLE_LOOP_CREDITS
from engines.training.turn_credit import TurnRows, turn_credit
from meg.expand import expand_episode
from meg.loops import chain_nodes, round_name
from storage.schema import SKIPPED, SampleBatch
from tasks.context import RunContext
from tasks.failures import ScoredRows


def _lineages(ctx: RunContext, episodes: set[str]) -> dict[str, dict[str, str]]:
    """Sample id → its lineage as {node: sample id}, for every sample of `episodes`."""
    out: dict[str, dict[str, str]] = {}
    for eid in episodes:
        for infos in expand_episode(ctx.spec, eid).samples.values():
            for s in infos:
                out[s.id] = dict(s.lineage)
    return out


def loop_advantages(
    ctx: RunContext,
    scored: dict[str, tuple[SampleBatch, ScoredRows]],
    views: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, np.ndarray]:
    """Advantages of the loop rounds among `scored` (node → its rows and scores), per
    chain of rounds and its agent's credit rule; other nodes are not in the result.
    `views`: the score task's episode views (`tasks.scoring.episode_views`), where the
    tool observations are read."""
    spec = ctx.spec
    full = chain_nodes(spec)
    chains = {k: [n for n in ns if n in scored] for k, ns in full.items()}
    if not any(chains.values()):
        return {}
    episodes = {str(e) for b, _ in scored.values() for e in b.episode}
    lineage = _lineages(ctx, episodes)
    texts = {  # sample id → text, of the tool rows held (the observations)
        sid: v["text"]
        for ep in views.values()
        for sid, v in ep.items()
        if spec.nodes[v["node"]].is_tool
    }
    out: dict[str, np.ndarray] = {}
    for key, held in chains.items():
        if held:
            out.update(_chain(ctx, held, len(full[key]), scored, lineage, texts))
    return out


def _round_of(node: str) -> int:
    return int(node.rsplit("@", 1)[1])


def _chain(
    ctx: RunContext,
    nodes: list[str],
    rounds: int,
    scored: dict[str, tuple[SampleBatch, ScoredRows]],
    lineage: dict[str, dict[str, str]],
    texts: dict[str, str],
) -> dict[str, np.ndarray]:
    spec = ctx.spec
    first = spec.nodes[nodes[0]]
    assert first.turn is not None
    entry = round_name(first.turn.entry, 1)
    loss = spec.agents[first.agent].loss
    if loss.credit in WHOLE_LOOP_CREDITS and len(nodes) != rounds:
        raise RuntimeError(
            f"credit {loss.credit!r} needs every round of {first.turn.body!r} in one score task, "
            f"got {nodes}; the scoring plan should have joined them"
        )
    pos: dict[str, int] = {}
    cols: dict[str, list[Any]] = defaultdict(list)
    where: list[tuple[str, int]] = []
    for node in nodes:
        b, s = scored[node]
        for i in range(len(b)):
            if b.finish_reason[i] == SKIPPED:
                continue
            sid = str(b.sample_id[i])
            line = lineage[sid]
            r = _round_of(node)
            prev = line.get(round_name(first.turn.body, r - 1)) if r > 1 else None
            seen = [texts[x] for n, x in line.items() if x in texts]  # observations so far
            pos[sid] = len(where)
            where.append((node, i))
            root = line.get(entry, sid)  # a body node that does not fan out of the entry:
            group = root.rsplit("/", 1)[0]  # its own invocation is its group
            up = pos.get(prev, -1) if prev is not None else -1
            cols["parent"].append(up if up < 0 or cols["group"][up] == group else -1)
            cols["group"].append(group)
            cols["round"].append(r)
            cols["reward"].append(float(s.reward[i]) if s.used[i] else float("nan"))
            cols["state"].append(f"{r}|" + "|".join(seen))
    out = {n: np.zeros(len(scored[n][0]), np.float32) for n in nodes}
    if not where:
        return out
    rows = TurnRows(
        group=np.asarray(cols["group"], np.str_),
        parent=np.asarray(cols["parent"], np.int64),
        round=np.asarray(cols["round"], np.int64),
        reward=np.asarray(cols["reward"], np.float32),
        state=np.asarray(cols["state"], np.str_),
    )
    adv = turn_credit(loss.credit, rows, loss.advantage)
    for (node, i), a in zip(where, adv, strict=True):
        out[node][i] = a
    return out
