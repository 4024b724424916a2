"""Run metrics from the task results: per-step table, utilization, the summary JSON."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from storage.audit import Audit
from tasks.context import Timing
from tasks.rollout import GenRef
from tasks.scoring import RewardSum, ScoreRef
from tasks.training import StepRef


def timings(results: list[Any]) -> list[Timing]:
    return sorted((r.timing for r in results), key=lambda t: t.start)


def utilization(ts: list[Timing], wall_s: float, n_workers: int) -> float:
    """Busy time over (wall × workers): the share of worker time spent inside task bodies."""
    busy = sum(t.seconds for t in ts)
    return busy / (wall_s * n_workers) if wall_s > 0 and n_workers else 0.0


def per_step(results: list[Any], t0: float) -> list[dict[str, Any]]:
    """One row per step. `wall_s` is the interval between the completions of consecutive
    steps (the last optimizer step of each), so the rows add up to the run's wall time."""
    ends: dict[int, float] = defaultdict(float)
    rewards: dict[int, dict[str, RewardSum]] = defaultdict(lambda: defaultdict(RewardSum))
    team: dict[int, RewardSum] = defaultdict(RewardSum)
    versions: dict[int, dict[str, int]] = defaultdict(dict)
    tokens: dict[int, int] = defaultdict(int)
    for r in results:
        if isinstance(r, StepRef):
            ends[r.step] = max(ends[r.step], r.timing.end)
            versions[r.step][r.agent] = r.version
        elif isinstance(r, ScoreRef):
            team[r.step] += r.team
            for agent, v in r.agent_reward.items():
                rewards[r.step][agent] += v
        elif isinstance(r, GenRef):
            tokens[r.step] += r.decode_tokens
    rows, prev = [], t0
    for k in sorted(ends):
        rows.append(
            {
                "step": k,
                "wall_s": round(ends[k] - prev, 3),
                "reward_mean": {
                    a: round(v.mean, 4) for a, v in sorted(rewards[k].items()) if v.mean is not None
                },
                "team_reward": round(team[k].mean or 0.0, 4),
                "versions": versions[k],
                "decode_tokens": tokens[k],
            }
        )
        prev = max(prev, ends[k])
    return rows


def summary(
    *,
    mode: str,
    staleness: int,
    results: list[Any],
    t0: float,
    wall_s: float,
    n_workers: int,
    audit: Audit,
    store_url: str,
    run_id: str,
    run_dir: str,
    workload: str,
) -> dict[str, Any]:
    ts = timings(results)
    steps = per_step(results, t0)
    return {
        "workload": workload,
        "mode": mode,
        "staleness": staleness,
        "steps": len(steps),
        "wall_s": round(wall_s, 3),
        "utilization": round(utilization(ts, wall_s, n_workers), 4),
        "workers": n_workers,
        "task_runs": len(ts),
        "busy_s": round(sum(t.seconds for t in ts), 3),
        "per_step": steps,
        "consistency": {
            "rows_checked": audit.rows_checked,
            "violations": audit.violations,
            "max_lag": audit.max_lag,
            "steps_checked": audit.steps_checked,
            "accounting_errors": audit.accounting_errors,
            "steps_unverified": audit.steps_unverified,
            "problems": list(audit.problems[:20]),
        },
        "resumed_segments": sum(1 for r in results if isinstance(r, GenRef) and r.resumed),
        "publish_ms_median": publish_ms(results),
        "store_url": store_url,
        "run_id": run_id,
        "run_dir": run_dir,
    }


def publish_ms(results: list[Any]) -> float:
    """Median time of one weight publication (full weights, or an adapter) in ms."""
    times = [r.publish_s for r in results if isinstance(r, StepRef) and not r.resumed]
    return round(1e3 * float(np.median(times)), 3) if times else 0.0


def reward_gain(per_step_rows: list[dict[str, Any]], k: int = 3) -> float:
    """Mean team reward of the last k steps minus the first k (the learning check that
    docs/benchmarks.md reports)."""
    team = [r["team_reward"] for r in per_step_rows]
    if len(team) < 2 * k:
        k = max(1, len(team) // 2)
    return float(np.mean(team[-k:]) - np.mean(team[:k])) if team else 0.0
