"""Per-turn credit for agents that act in several turns of a bounded loop.

A coder writes code, tests run, a reviewer decides, the coder repairs, up to K rounds. Each
*row* is one turn of one agent; the rows of one prompt's rollouts form a *group*, and inside
a group rows form trees through `parent` (the previous turn of the same chain). A row no
other row names as parent is *final*: it ends a path, and its reward is that path's return.
The first-round row a row descends from is its *thread*. Three rules turn rows into one
advantage per row:

- `turn`: a turn is judged by its own reward against the other turns of the same group and
  round (`compute_advantages(estimator)` per (group, round)). Myopic: a repair that only
  pays off later gets no credit now.
- `episode`: every row of a thread gets the thread's advantage, computed by the estimator
  from the thread returns R (mean reward of the thread's final rows) of its group. Sound but
  coarse: a first turn that led to a good state is blamed for an unlucky repair after it.
- `crbc` (Cross-Rollout Bellman Closure): rows of a group that observed the same `state` are
  one merged state across rollouts. Bottom-up by round, Q(i) = reward[i] for a final row and
  the mean of V over i's children otherwise; V(state) = mean Q over the rows merged into it;
  A(i) = Q(i) − V(state[i]). A turn is credited for the *expected* value of where it led, so
  the luck of one rollout's later turns is averaged out by the other rollouts that reached
  the same state.

The CRBC paper ("Cross-Rollout Bellman Closure for Long-Horizon Agentic Reinforcement
Learning") was not available in our search tools; this follows its described principle
(per-step credit from states merged across a group's rollouts, a Bellman backup over the
merged state graph) and the closely related RTMC (arXiv 2604.11037, rollout-tree Monte
Carlo: aggregate returns across rollouts sharing a state to get per-step Q and advantages
without a critic). Where ours differs from RTMC: we back up *means* through the merged graph
(the closure), rather than using each rollout's own return from the state on.

Choices made here (not taken from the papers):

- States merge only within one round: the key is (group, round, state). Rounds give the
  backup its order (a child is always one round later), so the graph has no cycles even if
  two rounds produce the same signature string.
- A NaN reward marks a failed row: it gets advantage 0 under every rule and enters no
  statistic (no V mean, no thread return). A non-final row whose children are all excluded
  is excluded too. A thread with no finite final reward is excluded whole.
- `crbc` uses the estimator only for scale: with "grpo" the advantages are divided by the
  group's std (Bessel) of its *path* returns (rewards of its final rows) + 1e-6; with any
  other estimator they are left unscaled. Path returns, not thread returns: two threads can
  have equal mean returns while their branches differ, and their std of 0 would blow the
  nonzero per-turn advantages up by 1e6; whereas equal path returns make every Q equal
  and every A zero. With one round, this is exactly GRPO.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engines.training.advantages import ADVANTAGES, compute_advantages
from meg.registry import Registry

CreditFn = Callable[["TurnRows", str], np.ndarray]
CREDITS: Registry[CreditFn] = Registry("turn credit rule")
EPS = 1e-6


@dataclass(frozen=True, slots=True)
class TurnRows:
    """One row per turn, columns as numpy arrays (converted on construction).

    Validation catches the tree errors that would otherwise silently mis-assign credit: a
    parent in another group, or one that is not exactly one round earlier.
    """

    group: np.ndarray  # (N,) str: the prompt's group
    # (N,) int64: index of the previous turn; -1 for a first-round row (or a later turn whose
    # earlier ones are scored elsewhere: `turn` credit reads one round at a time)
    parent: np.ndarray
    round: np.ndarray  # (N,) int64 ≥ 1
    reward: np.ndarray  # (N,) float32, NaN = failed turn
    state: np.ndarray  # (N,) str: signature of what the agent observed before this turn

    def __post_init__(self) -> None:
        cols: dict[str, Any] = {
            "group": np.asarray(self.group, dtype=str),
            "parent": np.asarray(self.parent, dtype=np.int64),
            "round": np.asarray(self.round, dtype=np.int64),
            "reward": np.asarray(self.reward, dtype=np.float32),
            "state": np.asarray(self.state, dtype=str),
        }
        for name, col in cols.items():
            object.__setattr__(self, name, col)  # frozen: set once, here
        shapes = {name: col.shape for name, col in cols.items()}
        if any(len(s) != 1 for s in shapes.values()) or len({s[0] for s in shapes.values()}) > 1:
            raise ValueError(f"TurnRows columns must be 1-D of equal length; got {shapes}")
        self._check_tree()

    def _check_tree(self) -> None:
        n = len(self.parent)
        for i, (p, r) in enumerate(zip(self.parent.tolist(), self.round.tolist(), strict=True)):
            if r < 1:
                raise ValueError(f"row {i}: round {r} < 1 (rounds count from 1)")
            if p == -1:  # a first turn, or one whose earlier turns are not among these rows
                continue
            if not 0 <= p < n:
                raise ValueError(f"row {i}: parent index {p} out of range [-1, {n})")
            if self.group[p] != self.group[i]:
                raise ValueError(
                    f"row {i}: parent {p} is in group {str(self.group[p])!r}, "
                    f"not {str(self.group[i])!r}"
                )
            if self.round[p] != r - 1:
                raise ValueError(
                    f"row {i}: round {r} but parent {p} has round {int(self.round[p])}; "
                    f"a parent is exactly one round earlier"
                )

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def final(self) -> np.ndarray:
        """(N,) bool: no row names this one as parent (it ends a path)."""
        out = np.ones(len(self), dtype=bool)
        out[self.parent[self.parent >= 0]] = False
        return out


def register_credit(name: str) -> Callable[[CreditFn], CreditFn]:
    """Decorator: `@register_credit("turn")`."""
    return CREDITS.register(name)


def _ids(*keys: Sequence[Hashable] | np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids (N,) int64 of the rows' key tuples, and how many distinct keys there are."""
    seen: dict[tuple[Hashable, ...], int] = {}
    cols = (np.asarray(k).tolist() for k in keys)
    ids = [seen.setdefault(k, len(seen)) for k in zip(*cols, strict=True)]
    return np.asarray(ids, dtype=np.int64), len(seen)


def _estimate(estimator: str, values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """`compute_advantages` over the finite entries only; NaN entries (excluded) get 0."""
    out = np.zeros(len(values), dtype=np.float32)
    ok = np.isfinite(values)
    if ok.any():
        adv = compute_advantages(
            estimator, torch.from_numpy(values[ok]), torch.from_numpy(groups[ok])
        )
        out[ok] = adv.numpy()
    return out


def _segment_mean(ids: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """(size,) mean of the finite values per id; NaN where an id has none."""
    ok = np.isfinite(values)
    total = np.bincount(ids[ok], weights=values[ok], minlength=size)
    count = np.bincount(ids[ok], minlength=size)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def threads(rows: TurnRows) -> np.ndarray:
    """(N,) index of the first-round row each row descends from (rounds resolve in order)."""
    thread = np.arange(len(rows))
    for r in np.unique(rows.round):  # ascending: a parent's thread is known before its child's
        m = (rows.round == r) & (rows.parent >= 0)
        thread[m] = thread[rows.parent[m]]
    return thread


def _path_returns(rows: TurnRows) -> np.ndarray:
    """(N,) the reward of each final row (the return of the path it ends), NaN elsewhere."""
    return np.where(rows.final, rows.reward.astype(np.float64), np.nan)


@register_credit("turn")
def turn(rows: TurnRows, estimator: str) -> np.ndarray:
    """Own reward, baseline from the same group's turns of the same round."""
    key, _ = _ids(rows.group, rows.round)
    return _estimate(estimator, rows.reward.astype(np.float64), key)


@register_credit("episode")
def episode(rows: TurnRows, estimator: str) -> np.ndarray:
    """Thread return R (mean final reward in the thread), one advantage per thread."""
    gid, _ = _ids(rows.group)
    thread = threads(rows)
    ret = _segment_mean(thread, _path_returns(rows), len(rows))  # (N,), at roots only
    ret[rows.parent >= 0] = np.nan  # one value per thread: the root carries it
    adv = _estimate(estimator, ret, gid)[thread]  # (N,)
    adv[~np.isfinite(rows.reward)] = 0.0
    return adv


def bellman_closure(rows: TurnRows) -> tuple[np.ndarray, np.ndarray]:
    """(Q per row, V of each row's merged state), float64 (N,) each; NaN = excluded.

    Highest round first, so every child's merged state has its V before its parent's Q.
    """
    n = len(rows)
    sid, n_states = _ids(rows.group, rows.round, rows.state)
    reward = rows.reward.astype(np.float64)
    final = rows.final
    q = np.full(n, np.nan)
    v = np.full(n_states, np.nan)
    for r in np.unique(rows.round)[::-1]:
        kids = rows.round == r + 1
        backed = _segment_mean(rows.parent[kids], v[sid[kids]], n)  # (N,) mean V of children
        here = rows.round == r
        q[here] = np.where(final[here], reward[here], backed[here])
        q[here & ~np.isfinite(reward)] = np.nan  # a failed turn is excluded
        v_here = _segment_mean(sid[here], q[here], n_states)  # only this round's states
        v = np.where(np.isfinite(v_here), v_here, v)
    return q, v[sid]


def _round_baseline_for_lone_states(rows: TurnRows, q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """V where a merged state holds one row, replaced by the mean Q of its (group, round).

    A state seen by a single rollout has V = its own Q, so Q − V is 0 and the turn would
    learn nothing; a state that embeds an observation no other rollout shared (a verdict
    after its own test output) is the common case. Its baseline is then the round's mean
    Q across the group's rollouts, the per-turn analogue of GRPO's group mean."""
    sid, n_states = _ids(rows.group, rows.round, rows.state)
    ok = np.isfinite(q)
    size = np.bincount(sid[ok], minlength=n_states)[sid]  # (N,) finite rows per state
    rid, n_rounds = _ids(rows.group, rows.round)
    round_mean = _segment_mean(rid, q, n_rounds)[rid]
    return np.where(size > 1, v, round_mean)


@register_credit("crbc")
def crbc(rows: TurnRows, estimator: str) -> np.ndarray:
    """A(i) = Q(i) − V(merged state of i) (a state of one rollout: the round's mean Q);
    scaled by the group's path-return std for grpo."""
    q, v = bellman_closure(rows)
    v = _round_baseline_for_lone_states(rows, q, v)
    adv = np.where(np.isfinite(q), q - v, 0.0)
    if estimator == "grpo":
        gid, n_groups = _ids(rows.group)
        ret = _path_returns(rows)
        mean = _segment_mean(gid, ret, n_groups)[gid]  # (N,)
        dev = np.where(np.isfinite(ret), ret - mean, np.nan)
        ok = np.isfinite(dev)
        ssd = np.bincount(gid[ok], weights=dev[ok] ** 2, minlength=n_groups)
        count = np.bincount(gid[ok], minlength=n_groups)
        std = np.sqrt(ssd / np.maximum(count - 1, 1))  # (G,), Bessel as GRPO
        adv = adv / (std[gid] + EPS)
    return adv.astype(np.float32)


def turn_credit(name: str, rows: TurnRows, estimator: str) -> np.ndarray:
    """Advantages (N,) float32 for `rows` by credit rule `name` and advantage `estimator`.

    The estimator name is checked first, so a typo fails even where a rule would not use it.
    """
    ADVANTAGES.get(estimator)
    return CREDITS.get(name)(rows, estimator)
