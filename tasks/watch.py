"""The single-request stopping rules of the `rollverify` and `darts` rollout policies, as the
rollout backends' `Watch` (engines/rollout/base.py), and how a generate task samples with one.

- `Verify` (rollverify): a running sample whose reward is already decided stops there; it is
  stored as it stands (finish_reason `verified`), scored by the same reward (which gives it
  the reward every continuation would have got) and trained like any sample.
- `KeepFirst` (darts): a group samples more responses than the node's `n`; once `n` of them
  have ended, the group's others stop (`dropped`) and are never stored. The group keeps its
  `n` shortest finished responses, so it never waits for its own long tail.

Both decide from the tokens drawn (never from time): a retried task stops the same samples
at the same tokens, so its segment is the first attempt's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engines.rollout.base import Completion, SamplingParams, Watch
from workloads.datasets import TaskItem
from workloads.rewards import Decided


@dataclass
class Verify:
    """Stop request i once `decided(its text so far, its task)`.

    Decoding a request's whole response at every look costs O(L²/every) over a response of
    L tokens — minutes per batch at reasoning lengths. With a fast tokenizer (`backend`: its
    `tokenizers.Tokenizer`), each request's text is kept up to date by a `DecodeStream`
    (each token decoded once), and only a verdict of "decided" is confirmed on the full
    decode, the one the score reads: a stop is exact, and costs one full decode."""

    decided: Decided
    tasks: Sequence[TaskItem]  # per request
    decode: Callable[[Sequence[int]], str]
    every: int
    backend: Any = None  # a `tokenizers.Tokenizer`, or None: full decodes only
    reason: str = "verified"
    _texts: dict[int, tuple[Any, int, str]] = field(default_factory=dict)

    def finish(self, i: int) -> None:
        self._texts.pop(i, None)

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        task = self.tasks[i]
        if self.backend is None:
            return bool(self.decided(self.decode(tokens), task))
        from tokenizers.decoders import DecodeStream

        stream, fed, text = self._texts.get(i) or (DecodeStream(skip_special_tokens=True), 0, "")
        for t in tokens[fed:]:
            text += stream.step(self.backend, int(t)) or ""
        self._texts[i] = (stream, len(tokens), text)
        if not self.decided(text, task):  # the stream's text may lag a few bytes behind
            return False
        return bool(self.decided(self.decode(tokens), task))


@dataclass
class KeepFirst:
    """Stop the rest of a group once `keep` of its requests have ended."""

    groups: Sequence[int]  # per request
    keep: int
    every: int = 1
    reason: str = "dropped"
    ended: dict[int, int] = field(default_factory=dict)

    def finish(self, i: int) -> None:
        g = self.groups[i]
        self.ended[g] = self.ended.get(g, 0) + 1

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        return self.ended.get(self.groups[i], 0) >= self.keep


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


def watch_for(
    policy: Any,
    n: int,
    decided: Decided | None,
    tasks: Sequence[TaskItem],
    decode: Callable[[Sequence[int]], str],
    backend: Any = None,
) -> tuple[Watch, int] | None:
    """The watch a node's generate task samples under, and the responses each of its groups
    launches; None when the rollout policy stops no single request at this node (`full`,
    `april`, or `rollverify` at a node whose reward cannot judge a prefix). `tasks`: the task
    of each prompt (invocation); `decode`, `backend`: see `Verify`."""
    launched = policy.samples(n)
    if launched > n:
        return KeepFirst([i // launched for i in range(len(tasks) * launched)], keep=n), launched
    if policy.verifies and decided is not None:
        per_request = [t for t in tasks for _ in range(n)]
        return Verify(decided, per_request, decode, every=policy.every, backend=backend), n
    return None
