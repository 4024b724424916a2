"""Built-in workloads (MEG YAML files), task datasets, reward functions, tiny local models.

Plug-ins are found by name through registries (`workloads.rewards`, `workloads.datasets`);
a built-in workload is found by its name (`math-chain`) or any path to a YAML file.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent
BUILTIN = {
    "math-chain": _HERE / "math_chain.yaml",
    "debate": _HERE / "debate.yaml",
    "fanout": _HERE / "fanout.yaml",
    "critic-debate": _HERE / "critic_debate.yaml",
    "word-problems": _HERE / "word_problems.yaml",
    "longtail": _HERE / "longtail.yaml",
    "code": _HERE / "code.yaml",
    "code-repair": _HERE / "code_repair.yaml",
}


def resolve_config(name_or_path: str | Path) -> Path:
    """A built-in workload name, or a path to a MEG YAML file (returned as is)."""
    return BUILTIN.get(str(name_or_path), Path(name_or_path))
