"""The multi-agent execution graph (MEG): typed spec, loading and validation, analysis.

Imports nothing of the project; other layers pass their registries in.
"""

from meg.analysis import Analysis, analyze
from meg.errors import MEGError
from meg.expand import (
    EpisodeExpansion,
    InvocationPlan,
    SampleInfo,
    expand_episode,
    plan_invocations,
)
from meg.graph import ScoreGroup, ancestors, score_groups, sinks, topological_order
from meg.load import build_spec, is_hub_name, load_meg, parse_yaml, validate
from meg.spec import AgentSpec, DatasetSpec, MEGSpec, NodeSpec, RewardSpec, RunSpec

__all__ = [
    "AgentSpec",
    "Analysis",
    "DatasetSpec",
    "EpisodeExpansion",
    "InvocationPlan",
    "MEGError",
    "MEGSpec",
    "NodeSpec",
    "RewardSpec",
    "RunSpec",
    "SampleInfo",
    "ScoreGroup",
    "analyze",
    "ancestors",
    "build_spec",
    "expand_episode",
    "is_hub_name",
    "load_meg",
    "parse_yaml",
    "plan_invocations",
    "score_groups",
    "sinks",
    "topological_order",
    "validate",
]
