"""A small two-agent MEG (tests/meg's `BASE`) and loading it the way `flexmarl` does: with
the reward registry and the policies' own checks (`policies.problems`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from meg import MEGError, MEGSpec, load_meg
from policies import problems
from tests.meg.conftest import BASE, loop, plain  # noqa: F401  (fixtures)
from tests.tasks.conftest import tiny_model  # noqa: F401  (a fixture)
from workloads.rewards import known_rewards


@pytest.fixture
def base() -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(BASE))  # deep copy


def load(data: dict[str, Any], tmp_path: Path) -> MEGSpec:
    path = tmp_path / "meg.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_meg(path, known_rewards=known_rewards(), policy_problems=problems)


def refused(data: dict[str, Any], tmp_path: Path) -> MEGError:
    with pytest.raises(MEGError) as ei:
        load(data, tmp_path)
    assert str(tmp_path / "meg.yaml") in str(ei.value)
    return ei.value
