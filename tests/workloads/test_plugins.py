"""Plug-ins resolved next to the MEG, imported with errors that name them, and validation
of the user's rewards and generators (signatures, params, unknown names)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.runs.config import load_config
from meg import MEGError
from workloads.datasets import load_dataset
from workloads.plugins import PluginModules, module_name, worker_plugin


def meg(tmp: Path, **extra: Any) -> Path:
    data = {
        "name": "p",
        "agents": {"a": {"model": "hf://org/m"}},
        "nodes": {"x": {"agent": "a", "template": "Q: {question}"}},
        "rewards": {"x": {"fn": "exact_answer"}},
        **extra,
    }
    path = tmp / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(autouse=True)
def _forget_modules() -> Any:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("plug_"):
            del sys.modules[name]


def test_file_and_package_plugins_register_rewards_and_generators(tmp_path: Path) -> None:
    (tmp_path / "plug_file.py").write_text(
        "from workloads.rewards import register_reward\n"
        "@register_reward('plug_file_half', reads=lambda p: ())\n"
        "def half(sample, episode, task, **params): return 0.5\n"
    )
    pkg = tmp_path / "plug_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from plug_pkg.gen import pairs\n")
    (pkg / "gen.py").write_text(
        "def pairs(rng, size, *, base=10):\n"
        "    return [(f'{i}+{base}', str(i + base)) for i in range(size)]\n"
    )
    path = meg(
        tmp_path,
        plugins=["plug_file", "plug_pkg"],
        rewards={"x": {"fn": "plug_file_half"}},
        dataset={"generator": "plug_pkg:pairs", "params": {"base": 3}, "train_size": 4},
    )
    spec = load_config(str(path), check_models=False)
    assert spec.plugins == [str(tmp_path / "plug_file.py"), str(pkg)]
    assert [module_name(e) for e in spec.plugins] == ["plug_file", "plug_pkg"]
    splits = load_dataset(spec.dataset)
    assert splits.train[1].question == "1+3" and splits.train[1].answer == "4"
    shipped = worker_plugin("run1", spec.plugins)
    assert isinstance(shipped, PluginModules) and shipped.modules == ("plug_file", "plug_pkg")
    assert set(shipped.files) == {"plug_file.py", "plug_pkg/__init__.py", "plug_pkg/gen.py"}
    assert worker_plugin("run1", ["json"]) is None  # an installed module is not shipped


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"plugins": ["plug_missing.py"]}, "plugins", "no such file next to the MEG"),
        ({"plugins": ["plug_not_installed"]}, "plugins", "failed to import"),
        ({"rewards": {"x": {"fn": "plug_bad:nope"}}}, "rewards.x.fn", "cannot import module"),
        (
            {"rewards": {"x": {"fn": "exact_answr"}}},
            "rewards.x.fn",
            "unknown reward function 'exact_answr'; known: code_assertions",
        ),
        (
            {"rewards": {"x": {"fn": "verdict", "params": {"targett": "x"}}}},
            "rewards.x.params",
            "does not take params",
        ),
        ({"dataset": {"generator": "arithmetik"}}, "dataset.generator", "known: arithmetic"),
    ],
)
def test_plugin_mistakes_name_the_field(
    tmp_path: Path, extra: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(MEGError) as err:
        load_config(str(meg(tmp_path, **extra)), check_models=False)
    assert err.value.field == field and words in str(err.value)


def test_a_broken_plugin_or_a_bad_signature_is_reported(tmp_path: Path) -> None:
    (tmp_path / "plug_broken.py").write_text("raise RuntimeError('half-written module')\n")
    with pytest.raises(MEGError, match=r"plug_broken.*half-written module"):
        load_config(str(meg(tmp_path, plugins=["plug_broken"])), check_models=False)
    (tmp_path / "plug_sig.py").write_text("def two(sample, episode): return 1.0\n")
    path = meg(tmp_path, plugins=["plug_sig"], rewards={"x": {"fn": "plug_sig:two"}})
    with pytest.raises(MEGError, match=r"must take \(sample, episode, task, \*\*params\)"):
        load_config(str(path), check_models=False)
