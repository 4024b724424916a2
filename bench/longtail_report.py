"""The long-tail benchmark's keys and table (`bench/longtail.py` runs the arms): every policy
over the baseline of the same run, reward deltas paired by seed."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from rich.console import Console
from rich.table import Table


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The issue's keys: each policy over the baseline (medians over repeats)."""
    base = arms["baseline"]

    def over(arm: str, key: str, against: str = "baseline") -> float:
        return round(arms[arm][key] / arms[against][key], 4)

    def paired(arm: str, key: str = "team_reward_last3", against: str = "baseline") -> float:
        """The median over seeds of `arm` minus `against` of the same seed."""
        pairs = zip(arms[arm]["repeats"], arms[against]["repeats"], strict=True)
        return round(statistics.median(a[key] - b[key] for a, b in pairs), 4)

    spread = [r["team_reward_last3"] for r in base["repeats"]]
    keys: dict[str, dict[str, Callable[[], float]]] = {
        "april": {
            "april_step_time_ratio": lambda: over("april", "step_s"),
            "april_rollout_time_ratio": lambda: over("april", "rollout_s"),
        },
        "april_c4": {
            "april_c4_step_time_ratio": lambda: over("april_c4", "step_s"),
            "april_c4_rollout_time_ratio": lambda: over("april_c4", "rollout_s"),
        },
        "greso": {
            "greso_generated_tokens_ratio": lambda: over("greso", "decode_tokens_per_step"),
            "greso_reward_delta": lambda: paired("greso"),
        },
        "zero_adv": {
            "skip_train_time_ratio": lambda: over("zero_adv", "train_s"),
            "zero_adv_step_time_ratio": lambda: over("zero_adv", "step_s"),
        },
        "all_three": {
            "all_three_step_time_ratio": lambda: over("all_three", "step_s"),
            "all_three_generated_tokens_ratio": lambda: over("all_three", "decode_tokens_per_step"),
        },
        **{
            arm: {
                f"{arm}_generated_tokens_ratio": partial(over, arm, "decode_tokens_per_step"),
                f"{arm}_step_time_ratio": partial(over, arm, "step_s"),
                f"{arm}_reward_delta": partial(paired, arm),
            }
            for arm in ("rollverify", "darts", "echo", "bandit")
        },
        "maxrl": {"maxrl_reward_delta": lambda: paired("maxrl")},
    }
    keys["hf"] = {"hf_step_time_ratio": lambda: over("hf", "step_s")}
    if "hf" in arms:  # SRT against plain decoding in the same (hf) loop
        keys["srt"] = {
            "srt_decode_time_ratio": lambda: over("srt", "rollout_s", "hf"),
            "srt_step_time_ratio": lambda: over("srt", "step_s", "hf"),
            "srt_generated_tokens_ratio": lambda: over("srt", "decode_tokens_per_step", "hf"),
            "srt_logprob_gap": lambda: max(r["logprob_gap"] for r in arms["srt"]["repeats"]),
            "srt_reward_delta": lambda: paired("srt", against="hf"),
        }
    if "maxrl" in arms:  # SERA against MaxRL, the estimator it sizes groups for
        keys["sera"] = {
            "sera_reward_delta": lambda: paired("sera", against="maxrl"),
            "sera_generated_tokens_ratio": lambda: over("sera", "decode_tokens_per_step", "maxrl"),
            "sera_step_time_ratio": lambda: over("sera", "step_s", "maxrl"),
        }
    out = {
        "baseline_reward_spread": round(max(spread) - min(spread), 4),
        "zero_adv_fraction": base["zero_adv_fraction"],
    }
    for arm, fns in keys.items():
        if arm in arms:
            out |= {k: fn() for k, fn in fns.items()}
    if "heldout_team_reward" in base:  # over the arms evaluated (`--heldout-arms`)
        held = [a for a, m in arms.items() if "heldout_team_reward" in m]
        out["baseline_heldout_reward"] = base["heldout_team_reward"]
        out |= {
            f"{arm}_heldout_reward_delta": paired(arm, "heldout_team_reward")
            for arm in held
            if arm != "baseline"
        }
        if "sera" in held and "maxrl" in held:
            out["sera_over_maxrl_heldout_reward_delta"] = paired(
                "sera", "heldout_team_reward", "maxrl"
            )
    return out


def render(results: dict[str, Any]) -> None:
    t = Table(
        title=f"long-tail rollouts · {results['steps']} steps × {results['episodes_per_step']} "
        f"episodes · median of {results['repeats']}"
    )
    cols = (
        "workload",
        "arm",
        "step s",
        "root rollout s",
        "train s",
        "gen tok/step",
        "thrown away",
        "off-policy",
        "skipped",
        "zero-adv",
        "reward (last 3)",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("workload", "arm") else "right")
    for w in results["workloads"]:
        for arm, r in results[w]["arms"].items():
            t.add_row(
                w,
                arm,
                f"{r['step_s']:.2f}",
                f"{r['rollout_s']:.2f}",
                f"{r['train_s']:.1f}",
                f"{r['decode_tokens_per_step']:.0f}",
                f"{r['thrown_away_tokens']:.0f}",
                f"{r['offpolicy_frac']:.3f}",
                f"{r['skipped_prompts']:.0f}",
                f"{r['zero_adv_fraction']:.2f}",
                f"{r['team_reward_last3']:.3f}",
            )
    Console(width=160).print(t)
    for w in results["workloads"]:
        keys = {k: v for k, v in results[w].items() if k != "arms"}
        print(
            f"{w}: "
            + ", ".join(
                f"{k} {v:+.3f}" if "delta" in k else f"{k} {v:.3f}" for k, v in keys.items()
            )
        )
