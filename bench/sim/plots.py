"""PNG scaling curves (matplotlib, Agg): step time per mode against agents or accelerators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.sim.paper import CURVE_MODES, KEYS


def scaling_plot(rows: list[dict[str, Any]], x: str, title: str, path: Path) -> Path:
    """One line per mode; `x`: "agents" or "accelerators"."""
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r[x] for r in rows]
    for mode in CURVE_MODES:
        ax.plot(xs, [r[KEYS[mode]] for r in rows], marker="o", label=mode)
    ax.set_xlabel(x)
    ax.set_ylabel("simulated step time (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
