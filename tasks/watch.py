"""How a generate task samples under a rollout policy's `Watch` (the engines stop single
requests where it says; `policies.rollverify`, `policies.darts`): one request per sample,
then the `n` each prompt keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from engines.rollout.base import Completion, SamplingParams, Watch


def keep_first(comps: Sequence[Completion], keep: int) -> list[Completion]:
    """The `keep` completions a group trains: with nothing dropped and no more than `keep`,
    all of them as they are; otherwise the `keep` shortest that were not dropped (the first
    to end in lockstep decoding; the lower index on a tie), in sample order."""
    if len(comps) == keep and all(c.finish_reason != "dropped" for c in comps):
        return list(comps)
    ended = [(len(c.response_ids), k) for k, c in enumerate(comps) if c.finish_reason != "dropped"]
    if len(ended) < keep:
        raise RuntimeError(f"a group kept {len(ended)} finished responses of {keep} needed")
    return [comps[k] for k in sorted(k for _, k in sorted(ended)[:keep])]


def sample_watched(
    generate: Callable[..., list[list[Completion]]],
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    launched: int,
    watch: Watch,
) -> tuple[list[list[Completion]], int]:
    """Sample `launched` responses per prompt as single requests under `watch` (request
    p·launched + s is sample s of prompt p), then keep `params.n` per prompt: the same
    shape as `generate(prompts, params)`, [prompt][sample], and the tokens generated for
    responses that were not kept (they count as generated, never as trained)."""
    flat = [p for p in prompts for _ in range(launched)]
    out = generate(flat, replace(params, n=1), watch)
    comps = [o[0] for o in out]
    kept = [
        keep_first(comps[i * launched : (i + 1) * launched], params.n) for i in range(len(prompts))
    ]
    total = sum(len(c.response_ids) for c in comps)
    return kept, total - sum(len(c.response_ids) for group in kept for c in group)
