"""Pictures and Prefect artifacts of a run: reward curve, pipeline timeline, MEG, metrics.

The timeline has one row per worker and one bar per task run, coloured by agent, with the
phase as hatching: it is the picture that shows rollout and training overlapping (flex) or
taking turns (sync). Every artifact is also written to the run directory.

`FLEXMARL_PLOTS=0` (`PLOTS_ENV`) leaves the two pictures out, and their artifacts: drawing
them is 0.3-0.5 s of the driver's CPU a run, which a sweep of many short runs, or a test
suite that never looks at them, need not pay. Matplotlib is imported only to draw
(half a second more, in every process that imported this module and drew nothing).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from flows.report.metrics import PROMPTS
from tasks.context import Timing

PLOTS_ENV = "FLEXMARL_PLOTS"


def plots_wanted() -> bool:
    """Whether a run draws `reward_curve.png` and `timeline.png` (not when `PLOTS_ENV` is 0)."""
    return os.environ.get(PLOTS_ENV, "1").strip() != "0"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_HATCH = {
    "generate": "",
    "score": "..",
    "train_micro_batch": "//",
    "optimizer_step": "xx",
    "hand_over": "++",
}


def reward_curve(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["team_reward"] for r in rows], "k-o", lw=2, label="team")
    agents = sorted({a for r in rows for a in r["reward_mean"]})
    for a in agents:
        ax.plot(steps, [r["reward_mean"].get(a, float("nan")) for r in rows], "--", label=a)
    ax.set(xlabel="step", ylabel="mean reward", title=title, ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline(ts: list[Timing], path: Path, title: str) -> Path:
    plt = _pyplot()
    from matplotlib.patches import Patch

    workers = sorted({t.worker for t in ts})
    agents = sorted({t.agent for t in ts if t.agent != "-"})
    cmap = plt.get_cmap("tab10")
    colour = {a: cmap(i % 10) for i, a in enumerate(agents)} | {"-": (0.6, 0.6, 0.6, 1.0)}
    t0 = min((t.start for t in ts), default=0.0)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.8 * len(workers)))
    for (row, agent, phase), spans in _bars(ts, workers, t0).items():
        # one collection per (worker, agent, phase), not one bar per task: a run's thousands
        # of tasks drew in seconds as single bars
        ax.broken_barh(
            spans,
            (row - 0.35, 0.7),
            facecolors=colour[agent],
            hatch=_HATCH.get(phase, ""),
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_ylim(-0.6, len(workers) - 0.4)
    ax.autoscale(axis="x")
    ax.set_yticks(range(len(workers)), [w.replace("tcp://", "") for w in workers], fontsize=8)
    ax.set(xlabel="seconds since start", title=title)
    handles = [Patch(color=colour[a], label=a) for a in agents]
    handles += [
        Patch(facecolor="white", edgecolor="black", hatch=h, label=p) for p, h in _HATCH.items()
    ]
    ax.legend(
        handles=handles,
        fontsize=7,
        ncol=len(handles),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(workers) < 3 else -0.2),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(
    ts: list[Timing], workers: list[str], t0: float
) -> dict[tuple[int, str, str], list[tuple[float, float]]]:
    """Each task's (start, seconds) span, grouped by (worker row, agent, phase)."""
    row = {w: i for i, w in enumerate(workers)}
    out: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for t in ts:
        out.setdefault((row[t.worker], t.agent, t.phase), []).append((t.start - t0, t.seconds))
    return out


def _img_md(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"![{alt}](data:image/png;base64,{data})"


def publish(
    run_dir: Path, summary: dict[str, Any], mermaid: str, key: str, pictures: bool = True
) -> None:
    """Prefect artifacts (keyed, so they show on the Artifacts page) from the run's files;
    `pictures`: also the reward curve and the timeline (False: they were not drawn)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    rows = [
        {
            "step": r["step"],
            "wall_s": r["wall_s"],
            "team_reward": r["team_reward"],
            **{f"reward/{a}": v for a, v in r["reward_mean"].items()},
            "decode_tokens": r["decode_tokens"],
            # what the rollout and selection policies did (0 with the defaults)
            "carried_tokens": r["carried_tokens"],
            "offpolicy_tokens": r["offpolicy_tokens"],
            **{k: n for k, n in r.items() if k.endswith(PROMPTS)},  # the selection's counts
            "failed_rewards": sum(r["failed_rewards"].values()),
        }
        for r in summary["per_step"]
    ]
    create_table_artifact(
        table=rows, key=f"{key}-metrics", description=f"per-step metrics, {summary['mode']} mode"
    )
    if pictures:
        create_markdown_artifact(
            key=f"{key}-reward-curve",
            markdown=_img_md(run_dir / "reward_curve.png", "reward curve"),
            description="team and per-agent mean reward per step",
        )
        create_markdown_artifact(
            key=f"{key}-timeline",
            markdown=_img_md(run_dir / "timeline.png", "pipeline timeline"),
            description="one row per worker, one bar per task run (colour: agent, hatch: phase)",
        )
    create_markdown_artifact(
        key=f"{key}-meg",
        markdown=f"```mermaid\n{mermaid}```",
        description="the multi-agent execution graph",
    )
    c = summary["consistency"]
    create_markdown_artifact(
        key=f"{key}-summary",
        markdown=(
            f"**{summary['steps']} steps** in {summary['wall_s']:.1f} s, utilization "
            f"{summary['utilization']:.2f}, consistency violations {c['violations']} of "
            f"{c['rows_checked']} rows, resumed segments {summary['resumed_segments']}, "
            f"failed reward calls {summary['reward_failures'] or 'none'}"
        ),
    )
