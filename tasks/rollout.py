"""The generate task: one (node, step, micro-batch) of dependency-parallel sampling.

Unpack → read the parents' committed segments → plan invocations with the MEG's own fan-out
rules → splice prompts as token ids → sample on this worker's resident host → commit one
segment → return a small `GenRef`. A child task starts the moment its parents' segments of
the same micro-batch are committed: that is the whole dependency-parallel sampler.

A retried or resumed task finds its segment already committed and returns it unchanged, so a
segment is generated at most once per run (counted as `resumed`).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
from prefect import task

from engines.rollout.base import RolloutError, SamplingParams
from engines.rollout.prompts import invocation_prompt
from engines.training.publish import latest_published, weights_key
from meg import ScoreGroup
from meg.expand import InvocationPlan, SampleInfo, expand_episode, plan_invocations
from policies import rollout_policy
from policies.base import NodeRequests
from storage.schema import SampleBatch, SegmentKey
from storage.state import Host as HostMem
from storage.table import SegmentRef
from tasks.carry import birth_step, generate_cut, read_carried, settle
from tasks.context import RunContext, Stopwatch
from tasks.external import external_row, sample_external, split
from tasks.gating import can_skip, plan_row, skipped, skipped_rows
from tasks.grad_parts import gradient_part
from tasks.refs import Episode, GenRef
from tasks.scoring import rows_to_hand, score_rows
from tasks.tool_calls import commit_tool_segment, tool_rows
from tasks.watch import sample_watched
from tasks.worker import host_of, state_of, store_of, tokenizer_of
from workloads.rewards import early_check


def _retry_on_crash(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a crashed host or worker, never a user error (prompt too long, bad model dir)."""
    try:
        state.result()
    except RolloutError as e:
        from engines.rollout.base import HostCrashedError

        return isinstance(e, HostCrashedError)
    except Exception:
        return True
    return False


def ensure_weights(ctx: RunContext, host: Any, agent: str, min_version: int) -> int:
    """Bring the host to the version this rollout must sample `agent` with; return it.

    `flex` and `sync` need exactly `min_version` (zero staleness: a newer policy would break
    the consistency rule as surely as an older one); `async(η)` takes the newest published
    version at or above it. A full-weight host loads the published weights; a host shared by
    LoRA agents loads the agent's published adapter (`engines.rollout.hosts`)."""
    held = host.held(agent)
    if min_version == 0 and held == 0:
        return 0
    state = state_of(ctx)
    exact = ctx.mode != "async"
    latest = latest_published(state, agent)
    if latest is None or latest < min_version:
        raise RuntimeError(
            f"agent {agent!r}: version {min_version} is required but the newest published "
            f"is {latest}; the optimizer-step task should have published it"
        )
    version = min_version if exact else latest
    if exact and held > version:
        raise RuntimeError(
            f"agent {agent!r}: the host already holds version {held}, but this "
            f"{ctx.mode} rollout must sample with version {version}"
        )
    host.load(agent, version, lambda: state.get(weights_key(agent, version), to=HostMem()))
    return int(host.held(agent))


def _parent_infos(
    ctx: RunContext, node: str, step: int, mb: int
) -> tuple[dict[str, SampleBatch], dict[str, int]]:
    """Committed rows of each input node for (step, micro-batch), and row index by sample id."""
    spec, st = ctx.spec, store_of(ctx)
    batches: dict[str, SampleBatch] = {}
    index: dict[str, int] = {}
    for parent in spec.nodes[node].inputs:
        b = st.table(spec.nodes[parent].agent).read(step=step, node=parent, micro_batch=mb)
        batches[parent] = b
        index.update({str(s): i for i, s in enumerate(b.sample_id)})
    return batches, index


def plan_inputs(
    ctx: RunContext, node: str, step: int, mb: int, episodes: tuple[Episode, ...]
) -> tuple[list[InvocationPlan], dict[str, SampleBatch], dict[str, int]]:
    """Invocation plans (with lineage-correct inputs), the inputs' committed rows and each
    sample id's row in its input's batch."""
    spec = ctx.spec
    nspec = spec.nodes[node]
    batches, index = _parent_infos(ctx, node, step, mb)
    if ctx.spec.run.rollout.carries and nspec.inputs:  # april: only the episodes not cut
        present = {str(e) for b in batches.values() for e in b.episode}
        episodes = tuple(e for e in episodes if e[0] in present)
    plans = []
    for eid, _ in episodes:
        symbolic = expand_episode(spec, eid).samples  # lineage is structural
        parent_samples: dict[str, list[SampleInfo]] = {}
        for parent in nspec.inputs:
            b = batches[parent]
            infos = []
            for s in symbolic[parent]:
                if s.id not in index:
                    raise RuntimeError(f"sample {s.id} of parent {parent!r} is not in the store")
                lp = b.logprob(index[s.id])
                infos.append(
                    SampleInfo(s.id, parent, s.lineage, float(np.mean(lp)) if len(lp) else 0.0)
                )
            parent_samples[parent] = infos
        plans.extend(plan_invocations(node, nspec, parent_samples, eid))
    return plans, batches, index


def prompts_of(
    ctx: RunContext,
    node: str,
    plans: list[InvocationPlan],
    batches: dict[str, SampleBatch],
    index: dict[str, int],
    episodes: tuple[Episode, ...],
) -> list[list[int]]:
    """The prompt token ids of `plans`: parents spliced in as the ids they sampled."""
    spec = ctx.spec
    nspec = spec.nodes[node]
    tok_path = spec.agents[nspec.agent].tokenizer_path
    items = dict(episodes)
    prompts = []
    for plan in plans:
        answers = [
            (
                parent,
                spec.agents[spec.nodes[parent].agent].tokenizer_path,
                [batches[parent].response(index[s.id]).tolist() for s in samples],
            )
            for parent, samples in plan.inputs
        ]
        prompts.append(invocation_prompt(nspec, tok_path, items[plan.episode].question, answers))
    return prompts


def plan_prompts(
    ctx: RunContext, node: str, step: int, mb: int, episodes: tuple[Episode, ...]
) -> tuple[list[Any], list[list[int]]]:
    """Invocation plans (with lineage-correct inputs) and their prompt token ids."""
    plans, batches, index = plan_inputs(ctx, node, step, mb, episodes)
    return plans, prompts_of(ctx, node, plans, batches, index, episodes)


def skipped_plans(
    ctx: RunContext,
    node: str,
    plans: list[InvocationPlan],
    batches: dict[str, SampleBatch],
    index: dict[str, int],
) -> list[bool]:
    """Per plan, whether it is skipped (`tasks.gating`): conditions read their input's text
    as the rewards do."""
    spec = ctx.spec
    if not can_skip(spec):
        return [False] * len(plans)

    def decode(parent: str, ids: Any) -> str:
        tok = tokenizer_of(ctx, spec.nodes[parent].agent)
        return str(tok.decode(list(ids), skip_special_tokens=True))

    return skipped(spec.nodes[node], plans, batches, index, decode)


def sampling_for(ctx: RunContext, node: str, step: int, mb: int) -> SamplingParams:
    spec = ctx.spec
    nspec = spec.nodes[node]
    agent = spec.agents[nspec.agent]
    eos = tokenizer_of(ctx, nspec.agent).eos_token_id
    seed = zlib.crc32(f"{ctx.seed}/{step}/{mb}/{node}".encode())
    max_tokens = spec.node_max_tokens(node)
    return SamplingParams(
        n=nspec.n,
        temperature=agent.sampling.temperature,
        top_p=agent.sampling.top_p,
        max_tokens=max_tokens,
        seed=seed,
        stop_token_ids=(eos,) if eos is not None else (),
        speculate=rollout_policy(spec).speculation(max_tokens),
        sparse_kv=rollout_policy(spec).kv_budget(max_tokens),
    )


def sample(
    ctx: RunContext,
    node: str,
    host: Any,
    agent: str,
    plans: list[Any],
    prompts: list[list[int]],
    params: SamplingParams,
    episodes: tuple[Episode, ...],
) -> tuple[list[list[Any]], int]:
    """The node's completions, [invocation][sample], and the tokens generated for responses
    not kept: as one batch, or under the watch the rollout policy samples this node with,
    which stops single requests (`tasks.watch`)."""
    reward = ctx.spec.rewards.get(node)
    tok = tokenizer_of(ctx, agent)
    items = dict(episodes)
    requests = NodeRequests(
        params.n,
        [items[plan.episode] for plan in plans],
        None if reward is None else early_check(reward.fn),
        lambda ids: tok.decode(list(ids), skip_special_tokens=True),  # as the score reads it
        getattr(tok, "backend_tokenizer", None),  # fast tokenizers: incremental decoding
    )
    chosen = rollout_policy(ctx.spec).watch(requests)
    if chosen is None:
        return host.generate(prompts, params, agent), 0
    watch, launched = chosen
    return sample_watched(
        lambda p, sp, w: host.generate(p, sp, agent, watch=w), prompts, params, launched, watch
    )


def generate_segment(
    ctx: RunContext,
    node: str,
    step: int,
    mb: int,
    episodes: tuple[Episode, ...],
    min_version: int,
) -> tuple[GenRef, SampleBatch]:
    """Generate (or find committed) the segment of `node` in micro-batch (step, mb); its ref
    and its rows (what a fused score reads)."""
    spec = ctx.spec
    agent_name = spec.nodes[node].agent
    watch = Stopwatch("generate", agent_name, step, mb)
    table = store_of(ctx).table(agent_name)
    done = table.has_segment(SegmentKey(step, mb, node))

    cuts = ctx.spec.run.rollout.carries and not spec.nodes[node].inputs

    def gen_ref(
        ref: SegmentRef,
        batch: SampleBatch,
        resumed: bool,
        carried: SampleBatch | None = None,
        discarded: int = 0,
        startup: float = 0.0,
    ) -> tuple[GenRef, SampleBatch]:
        if carried is None:  # what this segment's task carried, if it cuts: from the store
            carried = read_carried(ctx, node, step, mb) if cuts else SampleBatch.empty()
        old = int(batch.carried_tokens.sum())
        held = int(carried.response_lengths.sum())
        in_segment = int(batch.response_lengths.sum())
        # generated now: the segment's new tokens, those carried on, those not kept (darts)
        tokens = in_segment - old + held - int(carried.carried_tokens.sum()) + discarded
        if spec.nodes[node].is_tool:  # the environment's text: nothing decoded, or trained
            tokens = in_segment = 0
        return GenRef(
            node,
            agent_name,
            step,
            mb,
            ref,
            len(batch),
            tokens,
            ref.versions,
            resumed,
            watch.done(),
            carried_tokens=held,
            offpolicy_tokens=old,
            segment_tokens=in_segment,
            startup=startup,
        ), batch

    if done is not None:  # committed by an earlier attempt or an earlier (killed) run
        ref = table.ref(done)
        return gen_ref(ref, table.read(segments=[ref]), resumed=True)
    if cuts:
        host, startup = host_of(ctx, agent_name)
        version = ensure_weights(ctx, host, agent_name, min_version)
        # april: over-provisioned root, cut once enough episodes are complete
        fresh = tuple(e for e in episodes if birth_step(e[0]) == step)
        plans, prompts = plan_prompts(ctx, node, step, mb, fresh)
        result = generate_cut(
            ctx,
            node,
            step,
            mb,
            list(zip(plans, prompts, strict=True)),
            version,
            sampling_for(ctx, node, step, mb),
            lambda p, sp, cut: host.generate(p, sp, agent_name, cut=cut),
            rollout_policy(spec).quota,
        )
        key = SegmentKey(step, mb, node)
        result = settle(result, table.read_carry(key))  # an earlier attempt's carry wins
        table.write_segment(key, result.carried, kind="carry")  # first: see tasks.carry
        ref = table.write_segment(key, result.complete)
        return gen_ref(ref, result.complete, resumed=False, carried=result.carried, startup=startup)
    plans, batches, index = plan_inputs(ctx, node, step, mb, episodes)
    skip = skipped_plans(ctx, node, plans, batches, index)
    if spec.nodes[node].is_tool:
        rows, rewards, status = tool_rows(
            ctx, node, step, plans, skip, batches, index, episodes, min_version
        )
        ref, batch = commit_tool_segment(table, SegmentKey(step, mb, node), rows, rewards, status)
        return gen_ref(ref, batch, resumed=False)
    live = [p for p, s in zip(plans, skip, strict=True) if not s]
    params = sampling_for(ctx, node, step, mb)
    source = rollout_policy(spec).external(agent_name)
    own, drawn_params = (params, None) if source is None else split(params, source)
    t0 = time.time()
    completions: list[list[Any]] = []
    discarded, version, startup, label = 0, min_version, 0.0, ""
    if live:
        host, startup = host_of(ctx, agent_name)
        version = ensure_weights(ctx, host, agent_name, min_version)
        prompts = prompts_of(ctx, node, live, batches, index, episodes)
        completions, discarded = sample(ctx, node, host, agent_name, live, prompts, own, episodes)
        if source is not None and drawn_params is not None:  # the groups' last rows
            drawn, label = sample_external(
                ctx, agent_name, source, prompts, drawn_params, ensure_weights
            )
            completions = [a + b for a, b in zip(completions, drawn, strict=True)]
    t1 = time.time()
    rows = []
    done_live = iter(zip(prompts if live else [], completions, strict=True))
    for plan, skipped_plan in zip(plans, skip, strict=True):
        if skipped_plan:
            rows += skipped_rows(plan, params.n, step, version, t0)
            continue
        prompt, outs = next(done_live)
        for j, (sid, c) in enumerate(zip(plan.sample_ids(params.n), outs, strict=True)):
            row = plan_row(
                plan,
                sid,
                step,
                version,
                c.finish_reason,
                (t0, t1),
                prompt,
                c.response_ids,
                c.logprobs,
            )
            rows.append(row if j < own.n else external_row(row, label))
    batch = SampleBatch.from_rows(rows)
    ref = table.write_segment(SegmentKey(step, mb, node), batch)
    return gen_ref(ref, batch, resumed=False, discarded=discarded, startup=startup)


@task(
    name="generate",
    retries=2,
    retry_delay_seconds=0.5,
    retry_condition_fn=_retry_on_crash,
    task_run_name="generate {node} k={step} mb={mb}",
    persist_result=False,
)
def generate(
    ctx: RunContext,
    node: str,
    step: int,
    mb: int,
    episodes: tuple[Episode, ...],
    weights: Any = None,
    base_version: int = 0,
    after: tuple[Any, ...] = (),
    score: ScoreGroup | None = None,
    grad: bool = False,
) -> GenRef:
    """`weights` is the optimizer step (a `StepRef`) whose published version this node needs
    at least (None: `base_version`, the agent's version when the run started). `after` only
    carries dependencies (the parents' GenRefs); the data itself is read from the store.

    `score`: the score group that waits on this node alone, scored here right after the
    segment is committed, from the rows in hand (the pipeline fuses it for a one-node MEG:
    one task hop and one store read less a step). Its `ScoreRef` rides in `GenRef.score`,
    its own `Timing` after the generate's; when the node is its agent's only node, the
    scored rows ride in `GenRef.scored` to the train task (no read back from the store).

    `grad` (with `score`, `run.rollout_gradients`): the scored rows are also back-propagated
    here, at the version they were sampled with, and the gradient rides in `GenRef.grad` to
    the agent's optimizer step (`tasks.grad_parts`)."""
    min_version = weights.version if weights is not None else base_version
    ref, batch = generate_segment(ctx, node, step, mb, episodes, min_version)
    if score is None:
        return ref
    scored, joined = score_rows(ctx, step, mb, episodes, score, {node: batch})
    rows = rows_to_hand(ctx, node, joined)
    part = None
    if grad and rows is not None and not ref.resumed:  # a resumed segment: the trainer's
        part = gradient_part(ctx, ref.agent, step, mb, min_version, rows)
    return replace(ref, score=scored, scored=rows, grad=part)
