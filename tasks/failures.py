"""What a failed reward call costs: the `run.scoring.on_failure` rules, as pure functions.

A call fails when the reward function raises, returns a non-number or runs over its timeout
(`tasks.reward_calls`). The sample keeps its row; its score segment says `failed: <why>`, and
the rule decides its reward and its group's advantages:

- `zero`: the failed sample gets reward 0 and its group is scored as usual. Right when a
  failure is the sample's own fault (model code that loops forever under a code reward):
  the policy should learn to avoid it.
- `drop_group`: the failed sample's reward is NaN and its whole group (one node invocation)
  gets advantage 0 — no learning signal, exactly like a group whose rewards are all equal;
  its other rows say `dropped: ...`. Right when the failure says nothing about the sample
  (a flaky judge service): a made-up 0 would be a wrong signal.

Reward means (progress, summary) count a sample scored 0 under `zero` and leave a NaN out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class NodeScores:
    """Raw outcomes of one node's reward calls: reward per row (NaN where failed) and the
    error of each failed call (None: fine)."""

    reward: np.ndarray  # (N,) float32
    error: list[str | None]

    @staticmethod
    def unscored(n: int) -> NodeScores:
        """Rows of a node with no reward bound: reward 0, nothing failed."""
        return NodeScores(np.zeros(n, np.float32), [None] * n)

    @property
    def failed(self) -> int:
        return sum(e is not None for e in self.error)


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """What is committed: reward and status per row, and which rows take part in the group
    advantages (`used`; the others get advantage 0)."""

    reward: np.ndarray  # (N,) float32
    status: np.ndarray  # (N,) str: "ok" | "failed: <why>" | "dropped: <why>"
    used: np.ndarray  # (N,) bool


def _status(raw: NodeScores) -> np.ndarray:
    return np.asarray(["ok" if e is None else f"failed: {e}" for e in raw.error], np.str_)


def _failed_mask(raw: NodeScores) -> np.ndarray:
    return np.asarray([e is not None for e in raw.error], bool)


def zero(raw: NodeScores, groups: np.ndarray) -> ScoredRows:
    reward = np.where(_failed_mask(raw), np.float32(0.0), raw.reward).astype(np.float32)
    return ScoredRows(reward, _status(raw), np.ones(len(reward), bool))


def drop_group(raw: NodeScores, groups: np.ndarray) -> ScoredRows:
    failed = _failed_mask(raw)
    bad = np.isin(groups, groups[failed])
    status = _status(raw)
    status = np.where(
        bad & ~failed, np.str_("dropped: a reward call of its group failed"), status
    ).astype(np.str_)
    reward = np.where(failed, np.float32(np.nan), raw.reward).astype(np.float32)
    return ScoredRows(reward, status, ~bad)


ON_FAILURE: dict[str, Callable[[NodeScores, np.ndarray], ScoredRows]] = {
    "zero": zero,
    "drop_group": drop_group,
}


def apply_failure_rule(rule: str, raw: NodeScores, groups: np.ndarray) -> ScoredRows:
    """`raw` scored by the rule named `rule` (`run.scoring.on_failure`); `groups`: the group
    id of each row."""
    return ON_FAILURE[rule](raw, np.asarray(groups))


def over_budget(failed: int, scored: int, max_fraction: float, min_samples: int) -> bool:
    """Whether a run that scored `scored` samples, `failed` of them failed, must stop."""
    return scored >= min_samples and failed > max_fraction * scored


class TooManyRewardFailures(RuntimeError):
    """More reward calls failed than `run.scoring.max_failed_fraction` allows."""


class FailureBudget:
    """Failed and scored samples of a run so far, against `max_failed_fraction`: a reward
    that fails on everything stops the run early, with its reasons, instead of training on
    zeros for days."""

    def __init__(self, max_fraction: float, min_samples: int) -> None:
        self.max_fraction, self.min_samples = max_fraction, min_samples
        self.failed: dict[str, int] = {}
        self.scored = 0
        self.example = ""

    def add(self, step: int, scored: int, failed: dict[str, int], example: str = "") -> None:
        """Count one score task's samples (`example`: one failed call, `sample: reason`);
        raise `TooManyRewardFailures` past the budget."""
        self.scored += scored
        self.example = self.example or example
        for agent, n in failed.items():
            self.failed[agent] = self.failed.get(agent, 0) + n
        total = sum(self.failed.values())
        if over_budget(total, self.scored, self.max_fraction, self.min_samples):
            per_agent = ", ".join(f"{a} {n}" for a, n in sorted(self.failed.items()))
            raise TooManyRewardFailures(
                f"{total} of {self.scored} scored samples failed their reward call by step "
                f"{step} ({per_agent}), more than run.scoring.max_failed_fraction = "
                f"{self.max_fraction:g}; the first: {self.example or '?'}. The reasons are in "
                "the worker log and in the store "
                "(score status `failed: ...`, e.g. `flexmarl store show`); fix the reward, "
                "raise its timeout (rewards.<node>.timeout_s) or the fraction, then --resume"
            )
