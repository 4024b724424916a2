"""Partial rollouts (`rollout: {policy: april}`): the root node's generate task, cut and carry.

A micro-batch of step k launches more episodes than it trains on. The root node's task

1. resumes first the episodes cut in (k-1, j): their finished samples as they are, their
   unfinished ones continued from where they stopped (prompt + partial response, the rest of
   the token budget), under the version this step samples with;
2. fills up to the launched count with new episodes of step k;
3. samples everything in one backend call with a `Cut`: once `quota` episodes have all their
   samples finished (and every episode already carried `max_carry` times: it must end now),
   the rest stop where they are;
4. commits the rows of the episodes it does not train now — the incomplete ones, finished
   and partial (finish_reason "partial") samples alike, and complete ones beyond the
   `quota` (`trained_episodes`) — as the *carry segment* of `(k, j, root)` (segment kind
   "carry", never returned by a normal read), then the `quota` trained episodes as the normal
   segment `(k, j, root)`, which the rest of the graph, scoring and training read as always.

Nothing downstream of the root sees a cut episode: its other nodes run only for the episodes
present in their parents' segments. Every token keeps the version that generated it
(`token_versions`), and the loss weighs each token by its own stored behaviour logprob, so a
continued prefix is corrected like any off-policy token. Sampling is seeded per (run, step,
micro-batch, node), so a retried task cuts at the same place and writes the same segments.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engines.rollout.base import Cut, SamplingParams
from storage.schema import SampleBatch, SegmentKey
from tasks.context import RunContext
from tasks.worker import store_of


def birth_step(episode: str) -> int:
    """The step an episode was launched in, from its id (`k3e12` → 3)."""
    return int(episode[1:].split("e", 1)[0])


def read_carried(ctx: RunContext, node: str, step: int, mb: int) -> SampleBatch:
    """The rows (step, mb) carried forward; empty when nothing was (or step < 0)."""
    if step < 0:
        return SampleBatch.empty()
    table = store_of(ctx).table(ctx.spec.nodes[node].agent)
    carried = table.read_carry(SegmentKey(step, mb, node))
    return carried if carried is not None else SampleBatch.empty()


@dataclass(frozen=True, slots=True)
class CutResult:
    complete: SampleBatch  # rows of the episodes trained now: this step's segment
    carried: SampleBatch  # rows of the cut (and surplus complete) episodes: the carry segment


def settle(result: CutResult, committed: SampleBatch | None) -> CutResult:
    """What a root task commits when an earlier attempt already committed the carry segment
    of the same key and died before the normal one (they are two writes, carry first).

    The committed carry is the truth: the next step resumes exactly its episodes, so none of
    them may be trained now. Sampling is seeded, so a retry usually cuts identically; but in
    `async` mode the host may have moved to a newer version between attempts and cut
    differently. An episode that this attempt cut and the committed carry lacks is dropped
    (neither trained nor continued: fewer episodes, never a sample trained twice)."""
    if committed is None:
        return result
    held = set(map(str, committed.episode))
    keep = [i for i, e in enumerate(result.complete.episode) if str(e) not in held]
    return CutResult(result.complete.take(keep), committed)


@dataclass(frozen=True, slots=True)
class _Request:
    episode: str
    row: dict[str, Any]  # the row so far (sample id, prompt, response, versions, ...)


def _row_of(batch: SampleBatch, i: int) -> dict[str, Any]:
    return {
        "sample_id": str(batch.sample_id[i]),
        "group_id": str(batch.group_id[i]),
        "parent_ids": str(batch.parent_ids[i]),
        "node": str(batch.node[i]),
        "episode": str(batch.episode[i]),
        "policy_version": int(batch.policy_version[i]),
        "prompt_ids": batch.prompt(i).tolist(),
        "response_ids": batch.response(i).tolist(),
        "logprobs": batch.logprob(i).tolist(),
        "token_versions": batch.token_version(i).tolist(),
        "finish_reason": str(batch.finish_reason[i]),
        "gen_start": float(batch.gen_start[i]),
    }


def generate_cut(
    ctx: RunContext,
    node: str,
    step: int,
    mb: int,
    new: list[tuple[Any, list[int]]],
    version: int,
    sampling: SamplingParams,
    generate: Any,
    quota_of: Callable[[int], int],
) -> CutResult:
    """Steps 1-3 of the module docstring. `new`: (invocation plan, prompt ids) of the new
    episodes of this micro-batch, in launch order; `sampling`: the node's parameters on the
    uncut path; `generate(prompts, params, cut)` samples; `quota_of(launched)`: the episodes
    a micro-batch that launched as many must complete (the rollout policy's `quota`)."""
    spec = ctx.spec
    max_carry = spec.run.rollout.carry_limit
    n = spec.nodes[node].n
    max_tokens = spec.node_max_tokens(node)
    old = read_carried(ctx, node, step - 1, mb)
    resumed = list(dict.fromkeys(str(e) for e in old.episode))
    launched = list(dict.fromkeys(plan.episode for plan, _ in new))
    episodes = resumed + launched[: max(0, len(launched) - len(resumed))]
    quota = min(len(episodes), quota_of(len(launched))) if episodes else 0
    group = {e: g for g, e in enumerate(episodes)}

    done: list[dict[str, Any]] = []  # finished before this step: kept as they are
    requests: list[_Request] = []
    for i in range(len(old)):
        row = _row_of(old, i)
        if row["finish_reason"] == "partial":
            requests.append(_Request(row["episode"], row))
        else:
            done.append(row)
    t0 = time.time()
    for plan, prompt in new:
        if plan.episode not in group:
            continue
        for sid in plan.sample_ids(n):
            row = {
                "sample_id": sid,
                "group_id": plan.group_id,
                "parent_ids": ",".join(plan.parent_ids()),
                "node": node,
                "episode": plan.episode,
                "policy_version": version,
                "prompt_ids": list(prompt),
                "response_ids": [],
                "logprobs": [],
                "token_versions": [],
                "finish_reason": "partial",
                "gen_start": t0,
            }
            requests.append(_Request(plan.episode, row))
    must = frozenset(group[e] for e in episodes if step - birth_step(e) >= max_carry)
    sampled = {r.episode for r in requests}
    ready = sum(1 for e in episodes if e not in sampled)  # complete, carried whole
    cut = Cut(
        groups=tuple(group[r.episode] for r in requests),
        quota=max(0, quota - ready),
        must_finish=must & {group[r.episode] for r in requests},
        max_tokens=tuple(max(1, max_tokens - len(r.row["response_ids"])) for r in requests),
    )
    params = SamplingParams(  # one request per sample, seeded apart from the uncut path
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=max_tokens,
        seed=zlib.crc32(f"{ctx.seed}/{step}/{mb}/{node}/cut".encode()),
        stop_token_ids=sampling.stop_token_ids,
    )
    prompts = [r.row["prompt_ids"] + r.row["response_ids"] for r in requests]
    outs = generate(prompts, params, cut) if requests else []
    t1 = time.time()
    rows = list(done)
    for r, out in zip(requests, outs, strict=True):
        c = out[0]
        row = dict(r.row)
        row["response_ids"] = row["response_ids"] + list(c.response_ids)
        row["logprobs"] = row["logprobs"] + list(c.logprobs)
        row["token_versions"] = row["token_versions"] + [version] * len(c.response_ids)
        row["policy_version"] = version
        row["finish_reason"] = c.finish_reason
        rows.append(row)
    for row in rows:
        row.update(step=step, gen_end=t1)
    incomplete = {row["episode"] for row in rows if row["finish_reason"] == "partial"}
    trained = trained_episodes([e for e in episodes if e not in incomplete], quota, step, max_carry)

    def batch(pick: bool) -> SampleBatch:
        chosen = [row for row in rows if (row["episode"] in trained) == pick]
        chosen.sort(key=lambda row: (group[row["episode"]], row["sample_id"]))
        return SampleBatch.from_rows(chosen)

    return CutResult(batch(True), batch(False))


def trained_episodes(complete: list[str], quota: int, step: int, max_carry: int) -> set[str]:
    """Which complete episodes a step trains: exactly `quota` (as many as a step without
    APRIL), oldest first, and more only when episodes carried `max_carry` times are due. Any
    other complete episode is carried whole to the next step (trained there, with no new
    token to generate): requests that finish in the same decode step as the cut would
    otherwise make the step train more than its batch. `complete` is in launch order."""
    due = [e for e in complete if step - birth_step(e) >= max_carry]
    rest = sorted((e for e in complete if e not in due), key=birth_step)  # stable: launch order
    return set(due + rest[: max(0, quota - len(due))])
