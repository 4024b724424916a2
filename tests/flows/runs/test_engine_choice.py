"""`backend: auto`: the rollout engine a run chooses for an agent whose MEG names none, from
the model, its nodes' prompts and the machine; recorded once, kept on resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from flows.runs.config import load_config
from flows.runs.engine_choice import (
    HF_MAX_PARAMETERS,
    HF_MAX_PROMPT_CHARS,
    ModelFacts,
    choose_engines,
    count_parameters,
    pick,
)
from flows.runs.resolve import ResolveError, continued
from flows.train import TrainParams, check
from meg import MEGSpec

SMALL = ModelFacts(parameters=500_000, roots_only=True, prompt_chars=10, needs_hf=None)


def one_node(tmp_path: Path, model: str, **agent: Any) -> Path:
    """The TRL peer job's shape: one agent, one root node, short arithmetic prompts."""
    from bench.peer_job import Job, meg_config

    path = meg_config(Job(2, 2, 4, 2), model, tmp_path, backend="auto")
    data = yaml.safe_load(path.read_text())
    data["agents"]["policy"].update(agent)
    path.write_text(yaml.safe_dump(data))
    return path


def test_pick_gives_hf_only_where_it_was_measured_faster() -> None:
    backend, why = pick(SMALL, gpus=0, own_cluster=True)
    assert backend == "hf" and "0.5 M parameters, prompts of at most 10 characters" in why
    big = ModelFacts(HF_MAX_PARAMETERS + 1, True, 10, None)
    long = ModelFacts(500_000, True, HF_MAX_PROMPT_CHARS + 1, None)
    unread = ModelFacts(500_000, True, None, None)
    for facts, gpus, own, reason in [
        (SMALL, 1, True, "1 GPU(s) seen"),
        (SMALL, 0, False, "the workers are another cluster's"),
        (ModelFacts(None, True, 10, None), 0, True, "its size cannot be read here"),
        (ModelFacts(500_000, False, None, None), 0, True, "reads earlier answers"),
        (long, 0, True, f"its prompts run over {HF_MAX_PROMPT_CHARS} characters"),
        (unread, 0, True, "its dataset cannot be read here"),
        (big, 0, True, "12.0 M parameters (hf is faster up to 12.0 M)"),
    ]:
        backend, why = pick(facts, gpus, own)
        assert backend == "vllm" and reason in why, (facts, gpus, own)
    only = ModelFacts(None, False, None, "speculative rollout (srt) drafts on hf only")
    assert pick(only, gpus=8, own_cluster=False) == ("hf", only.needs_hf)


def test_count_parameters_reads_the_safetensors_headers(tiny_model: str) -> None:
    [weights] = Path(tiny_model).glob("*.safetensors")
    assert count_parameters(tiny_model) == sum(t.numel() for t in load_file(weights).values())
    assert count_parameters("hf://Qwen/Qwen2.5-0.5B") is None  # a hub name: not fetched here


def test_a_one_node_job_on_a_small_model_gets_hf_and_says_why(
    tmp_path: Path, tiny_model: str
) -> None:
    spec = load_config(str(one_node(tmp_path, tiny_model)))
    assert spec.agents["policy"].backend == "auto"  # the MEG's default
    chosen, [line] = choose_engines(spec, gpus=0, own_cluster=True)
    assert chosen.agents["policy"].backend == "hf"
    assert line.startswith("backend: hf for policy: 0.5 M parameters, prompts of at most 10")
    assert choose_engines(spec, gpus=1, own_cluster=True)[0].agents["policy"].backend == "vllm"
    mine = load_config(str(one_node(tmp_path, tiny_model, backend="vllm")))
    assert choose_engines(mine, gpus=0, own_cluster=True) == (mine, [])  # theirs, untouched


def test_long_prompts_keep_vllm(tmp_path: Path, tiny_model: str) -> None:
    data = yaml.safe_load(one_node(tmp_path, tiny_model).read_text())
    data["nodes"]["solve"]["template"] = "Work it out step by step. " * 6 + "Q: {question}=\nA:"
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(data))
    chosen, [line] = choose_engines(load_config(str(tmp_path / "long.yaml")), 0, True)
    assert chosen.agents["policy"].backend == "vllm" and "run over 128 characters" in line


def test_the_agents_of_one_model_share_one_choice(tmp_path: Path, tiny_model: str) -> None:
    """math-chain's verifier reads the solver's answer: both agents (one model) keep vLLM,
    while a second model whose agent reads only the task gets hf."""
    from tests.flows.conftest import write_config

    data = yaml.safe_load(write_config(tmp_path, tiny_model).read_text())
    for agent in data["agents"].values():
        del agent["backend"]
    (tmp_path / "chain.yaml").write_text(yaml.safe_dump(data))
    chosen, [line] = choose_engines(load_config(str(tmp_path / "chain.yaml")), 0, True)
    assert {a.backend for a in chosen.agents.values()} == {"vllm"}
    assert line.startswith("backend: vllm for solver, verifier: a node of its agents reads")

    other = tmp_path / "other-model"
    other.symlink_to(Path(tiny_model), target_is_directory=True)
    data["agents"]["solver"]["model"] = str(other)
    (tmp_path / "split.yaml").write_text(yaml.safe_dump(data))
    chosen, lines = choose_engines(load_config(str(tmp_path / "split.yaml")), 0, True)
    assert chosen.agents["solver"].backend == "hf" and chosen.agents["verifier"].backend == "vllm"
    assert len(lines) == 2


def test_speculative_rollout_gets_hf_even_with_gpus(tmp_path: Path, tiny_model: str) -> None:
    data = yaml.safe_load(one_node(tmp_path, tiny_model).read_text())
    data["run"]["rollout"] = {"policy": "srt", "draft": 2}
    (tmp_path / "srt.yaml").write_text(yaml.safe_dump(data))
    spec = load_config(str(tmp_path / "srt.yaml"))
    chosen, [line] = choose_engines(spec, gpus=2, own_cluster=False)
    assert chosen.agents["policy"].backend == "hf" and "srt" in line


def test_a_planned_run_records_the_choice_and_its_source(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU rule, on any machine
    cfg = str(one_node(tmp_path, tiny_model))
    settled = check(TrainParams(config=cfg, run_dir=str(tmp_path / "run")))
    assert settled.run.ctx.spec.agents["policy"].backend == "hf"
    assert settled.run.sources["agents.policy.backend"] == "auto"
    assert settled.notes[0].startswith("backend: hf for policy")  # then the layout's, ...
    theirs = TrainParams.model_validate(
        {"config": cfg, "run_dir": str(tmp_path / "run2"), "cluster": {"scheduler": "x:1"}}
    )
    remote = check(theirs).run
    assert remote.ctx.spec.agents["policy"].backend == "vllm"  # devices unknown from here


def test_a_resume_keeps_the_recorded_backend(tmp_path: Path, tiny_model: str) -> None:
    """The MEG file given again still says `auto` (or nothing): the run's recorded choice
    stands; a backend written in it that differs is refused, named."""
    cfg = one_node(tmp_path, tiny_model)
    spec: MEGSpec = load_config(str(cfg))
    recorded, _ = choose_engines(spec, gpus=0, own_cluster=True)
    assert continued(recorded, {}, spec) is recorded
    assert json.loads(recorded.model_dump_json())["agents"]["policy"]["backend"] == "hf"
    changed = load_config(str(one_node(tmp_path, tiny_model, backend="vllm")))
    with pytest.raises(ResolveError, match=r"at `agents.policy.backend`"):
        continued(recorded, {}, changed)


def test_an_unresolved_auto_never_reaches_an_engine(tiny_model: str) -> None:
    from engines.rollout.base import UnknownBackendError, make_backend

    with pytest.raises(UnknownBackendError, match="'auto' is chosen when a run is planned"):
        make_backend("auto", tiny_model)
