"""`rollverify` (early verification): every `every` tokens, each running sample of a node
whose reward can judge a prefix (its `decided=` verdict, `workloads.rewards.early_check`) is
checked; one whose reward is already decided (a wrong number already written) stops there,
is stored as it stands (finish_reason `verified`), scored by the same reward (which gives it
the reward every continuation would have got) and trained like any sample.

The verdict decides from the tokens drawn, never from time: a retried task stops the same
samples at the same tokens, so its segment is the first attempt's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.rollout.base import Watch
from meg import MEGSpec
from meg.policies import RollVerify
from meg.registry import Registry
from policies.base import ROLLOUTS, NodeRequests, Problem, Rollout
from workloads.datasets import TaskItem
from workloads.rewards import Decided


@dataclass
class Verify:
    """The engines' `Watch` that stops request i once `decided(its text so far, its task)`.

    Decoding a request's whole response at every look costs O(L²/every) over a response of
    L tokens — minutes per batch at reasoning lengths. With a fast tokenizer (`tokenizer`:
    its `tokenizers.Tokenizer`), each request's text is kept up to date by a `DecodeStream`
    (each token decoded once), and only a verdict of "decided" is confirmed on the full
    decode, the one the score reads: a stop is exact, and costs one full decode."""

    decided: Decided
    tasks: Sequence[TaskItem]  # per request
    decode: Callable[[Sequence[int]], str]
    every: int
    tokenizer: Any = None  # a `tokenizers.Tokenizer`, or None: full decodes only
    reason: str = "verified"
    _texts: dict[int, tuple[Any, int, str]] = field(default_factory=dict)

    def finish(self, i: int) -> None:
        self._texts.pop(i, None)

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        task = self.tasks[i]
        if self.tokenizer is None:
            return bool(self.decided(self.decode(tokens), task))
        from tokenizers.decoders import DecodeStream

        stream, fed, text = self._texts.get(i) or (DecodeStream(skip_special_tokens=True), 0, "")
        for t in tokens[fed:]:
            text += stream.step(self.tokenizer, int(t)) or ""
        self._texts[i] = (stream, len(tokens), text)
        if not self.decided(text, task):  # the stream's text may lag a few bytes behind
            return False
        return bool(self.decided(self.decode(tokens), task))


@ROLLOUTS.register("rollverify")
@dataclass(frozen=True)
class EarlyVerify(Rollout[RollVerify]):
    def watch(self, node: NodeRequests) -> tuple[Watch, int] | None:
        """Each request alone under `Verify`, at a node whose reward has a prefix verdict;
        elsewhere one plain batch."""
        if node.decided is None:
            return None
        per_request = [t for t in node.tasks for _ in range(node.n)]
        every = self.model.every
        return Verify(node.decided, per_request, node.decode, every, node.tokenizer), node.n

    def problems(self, spec: MEGSpec, rewards: Registry[Any] | None) -> list[Problem]:
        if rewards is None:
            return []
        if any(rewards.meta(r.fn).get("decided") for r in spec.rewards.values()):
            return []
        able = [n for n in rewards.names() if rewards.meta(n).get("decided")]
        return [
            (
                "run.rollout",
                "the rollverify rollout policy stops samples whose reward is already decided, "
                "and no node's reward can judge a prefix; rewards that can: "
                f"{', '.join(able) or 'none'} (a plug-in declares one with "
                "`register_reward(..., decided=fn)`)",
            )
        ]
