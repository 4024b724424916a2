"""The rows an external policy samples into an agent's groups (the `external` rollout
policy): a node's `n` samples a prompt are `n - rows` of the agent's own and `rows` of the
external policy's, in that order, one advantage group.

The external policy samples the agent's own prompt token ids, so it must share the agent's
tokenizer (a teammate: `meg validate`; a frozen model: checked here when its host is built,
from the two vocabularies). Its rows keep the logprobs *it* assigned to its tokens (the
behaviour the loss corrects for) and carry `source` instead of a version of the agent
(`storage.schema.EXTERNAL_VERSION`): a teammate's rows name the version that wrote them,
`agent:<name>@v<k>`, its newest published one when the segment is sampled."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from engines.rollout.base import Completion, RolloutError, SamplingParams
from engines.tokenizers import tokenizer
from engines.training.publish import latest_published
from meg.policies import ExternalSource
from meg.sharing import WeightUnit
from storage.schema import EXTERNAL_VERSION
from tasks.context import RunContext
from tasks.worker import host_of, state_of

Ensure = Callable[[RunContext, Any, str, int], int]  # tasks.rollout.ensure_weights


def split(params: SamplingParams, source: ExternalSource) -> tuple[SamplingParams, SamplingParams]:
    """(the agent's own sampling, the external policy's): `n - rows` and `rows` samples a
    prompt, each from its own seed (the two draws are independent)."""
    own = replace(params, n=params.n - source.rows)
    seed = zlib.crc32(f"{params.seed}/external/{source.label}".encode())
    return own, replace(params, n=source.rows, seed=seed)


def sample_external(
    ctx: RunContext,
    learner: str,
    source: ExternalSource,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    ensure: Ensure,
) -> tuple[list[list[Completion]], str]:
    """The external policy's completions of `prompts`, [prompt][row], and the `source` its
    rows carry. A teammate samples at its newest published version (`ensure` brings its
    host there: `tasks.rollout.ensure_weights`); a frozen model with its own weights.

    The teammate's own generate tasks share its host and may load a newer version at any
    moment outside a generate call (which holds the host): if the host holds another
    version after sampling, the rows cannot be labelled with certainty and the task fails,
    to be retried (`tasks.rollout`'s retry condition), as it does when the newer version
    lands between reading the newest and loading it."""
    if source.agent is not None:
        mate = source.agent
        host, _ = host_of(ctx, mate)
        newest = latest_published(state_of(ctx), mate)
        version = ensure(ctx, host, mate, 0 if newest is None else newest)
        outs = host.generate(prompts, params, mate)
        if host.held(mate) != version:  # the teammate's own task loaded a newer one between
            raise RuntimeError(
                f"agent {mate!r}'s host moved from version {version} to {host.held(mate)} "
                "while it sampled as an external policy: its rows' version is unknown, so the "
                "task is retried"
            )
        return outs, f"{source.label}@v{version}"
    assert source.model is not None  # ExternalSource names exactly one
    check_vocabulary(ctx, learner, source.model)
    spec = ctx.spec.agents[learner]
    unit = WeightUnit(
        f"external-{zlib.crc32(source.model.encode()):08x}",
        source.model,
        spec.backend,
        spec.dtype,
        (learner,),
        False,
    )
    host, _ = host_of(ctx, learner, unit)
    return host.generate(prompts, params), source.label


def check_vocabulary(ctx: RunContext, learner: str, model: str) -> None:
    """A frozen model samples the learner's token ids: its tokenizer must be the learner's
    (the same vocabulary), else its rows would be other words under the same ids."""
    if not _same_vocabulary(ctx.spec.agents[learner].tokenizer_path, model):
        raise RolloutError(
            f"the external model {model} does not share agent {learner!r}'s tokenizer "
            f"({ctx.spec.agents[learner].tokenizer_path}): its samples are trained as the "
            "agent's token ids, so the two must have the same vocabulary"
        )


@cache
def _same_vocabulary(ours: str, model: str) -> bool:
    return bool(tokenizer(ours).get_vocab() == tokenizer(model).get_vocab())


def external_row(row: dict[str, Any], source: str) -> dict[str, Any]:
    """A generate task's row (`tasks.gating.plan_row`) as an external policy's: its source,
    and no version of the agent."""
    return {**row, "policy_version": EXTERNAL_VERSION, "source": source}
