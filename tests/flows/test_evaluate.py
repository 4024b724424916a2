"""`flexmarl evaluate` on a real tiny model: result structure, sources, user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.evaluate import EvalParams, evaluate
from flows.runs.record import Run, default_store
from meg import MEGSpec, load_meg
from tasks.context import RunContext
from tests.flows.conftest import write_config
from workloads.rewards import known_rewards


def check_result(out: dict, tasks: int) -> None:
    assert out["workload"] == "math-chain" and out["split"] == "eval" and out["tasks"] == tasks
    assert set(out["node_reward"]) == set(out["samples"]) == {"solve", "verify"}
    assert set(out["agent_reward"]) == set(out["models"]) == {"solver", "verifier"}
    # n=1 per invocation: one solve sample per task, one verdict per solve sample
    assert out["samples"] == {"solve": tasks, "verify": tasks}
    values = [*out["node_reward"].values(), *out["agent_reward"].values(), out["team_reward"]]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert out["team_nodes"] == ["solve"] and out["team_reward"] == out["node_reward"]["solve"]
    assert len(out["examples"]) == 3 and set(out["examples"][0]["outputs"]) == {"solve", "verify"}


def test_cli_evaluates_a_model_dir_and_writes_json(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, tiny_model)
    out_json = tmp_path / "eval.json"
    argv = ["evaluate", str(cfg), "--checkpoint", tiny_model, "--limit", "8"]
    assert main([*argv, "--json", str(out_json)]) == 0
    out = json.loads(out_json.read_text())
    check_result(out, 8)
    assert out["source"] == "model" and out["models"]["solver"] == Path(tiny_model).name
    printed = capsys.readouterr().out
    assert "greedy on 8 eval tasks" in printed and "verifier" in printed


def one_step(spec: MEGSpec) -> MEGSpec:
    return spec.with_run(steps=1, episodes_per_step=4, micro_batches=1, window=1)


def make_run_dir(tmp: Path, cfg: Path, model: str) -> Path:
    """A run directory as `flexmarl train` leaves it: run.json, final/solver, and only a
    checkpoint (no export) for the verifier: both lookup paths of `evaluate`."""
    from engines.training.checkpoint import save_checkpoint
    from engines.training.checkpoint_index import checkpoint_dir
    from engines.training.trainer import AgentTrainer, TrainConfig

    run_dir = tmp / "run"
    spec = load_meg(cfg, known_rewards=known_rewards())
    ctx = RunContext("math-chain-test", default_store(run_dir), one_step(spec))
    Run(run_dir, ctx).save()
    shutil.copytree(model, run_dir / "final" / "solver")
    trainer = AgentTrainer("verifier", model, TrainConfig())
    save_checkpoint(trainer, checkpoint_dir(ctx.checkpoint_root("verifier"), 1))
    return run_dir


def test_run_dir_base_and_model_dir_agree_on_the_same_weights(
    tmp_path: Path, tiny_model: str
) -> None:
    cfg = write_config(tmp_path, tiny_model)
    run_dir = make_run_dir(tmp_path, cfg, tiny_model)
    by_run = evaluate(EvalParams(config=str(cfg), checkpoint=str(run_dir), limit=6))
    check_result(by_run, 6)
    assert by_run["source"] == "run"
    assert by_run["models"] == {"solver": "final/solver", "verifier": "v000001"}
    base = evaluate(EvalParams(config=str(cfg), base=True, limit=6))
    assert base["source"] == "base"
    # same weights everywhere (export of an untrained checkpoint = the model): greedy
    # decoding gives the same texts and the same rewards
    for key in ("examples", "node_reward", "agent_reward", "team_reward"):
        assert by_run[key] == base[key], key


def test_missing_checkpoint_is_a_user_error(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, tiny_model)
    missing = tmp_path / "no-such-run"
    assert main(["evaluate", str(cfg), "--checkpoint", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {missing} does not exist" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert main(["evaluate", str(cfg), "--checkpoint", str(tmp_path / "empty")]) == 2
    assert "neither a flexmarl run directory" in capsys.readouterr().err


def test_run_without_exports_or_checkpoints_and_bad_limit_are_user_errors(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, tiny_model)
    run_dir = tmp_path / "run"
    spec = load_meg(cfg, known_rewards=known_rewards())
    Run(run_dir, RunContext("r", default_store(run_dir), one_step(spec))).save()
    with pytest.raises(ValueError, match="neither final/solver/ nor a checkpoint"):
        evaluate(EvalParams(config=str(cfg), checkpoint=str(run_dir)))
    assert main(["evaluate", str(cfg), "--base", "--limit", "0"]) == 2
    assert "--limit: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_a_lora_run_is_evaluated_with_its_adapters_merged(tmp_path: Path, tiny_model: str) -> None:
    """final/solver is an adapter export, the verifier has only an adapter checkpoint:
    both are merged into the base for evaluation, and an untrained adapter (B = 0) gives
    exactly the base model's greedy results."""
    import yaml

    from engines.training.checkpoint import export_hf, save_checkpoint
    from engines.training.checkpoint_index import checkpoint_dir
    from engines.training.lora import LoraConfig
    from engines.training.trainer import AgentTrainer, TrainConfig

    cfg = write_config(tmp_path, tiny_model)
    data = yaml.safe_load(cfg.read_text())
    for agent in data["agents"].values():
        agent["lora"] = True
    cfg.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    spec = load_meg(cfg, known_rewards=known_rewards())
    ctx = RunContext("math-chain-lora", default_store(run_dir), one_step(spec))
    Run(run_dir, ctx).save()
    lora = TrainConfig(lora=LoraConfig())
    solver, verifier = (AgentTrainer(a, tiny_model, lora) for a in ("solver", "verifier"))
    try:
        export_hf(solver, run_dir / "final" / "solver")
        save_checkpoint(verifier, checkpoint_dir(ctx.checkpoint_root("verifier"), 1))
    finally:
        solver.close()
        verifier.close()
    by_run = evaluate(EvalParams(config=str(cfg), checkpoint=str(run_dir), limit=6))
    check_result(by_run, 6)
    assert by_run["models"] == {"solver": "final/solver (adapter, merged)", "verifier": "v000001"}
    base = evaluate(EvalParams(config=str(cfg), base=True, limit=6))
    for key in ("examples", "node_reward", "agent_reward", "team_reward"):
        assert by_run[key] == base[key], key


def test_policy_sampling_with_repeats(tmp_path: Path, tiny_model: str) -> None:
    """`sampling="policy"`: the agents' own temperature, a distinct seed per prompt (the
    repeats of one task differ), reproducible run to run; greedy repeats are identical."""
    cfg = write_config(tmp_path, tiny_model)

    def run(sampling: str) -> dict:
        p = EvalParams(
            config=str(cfg), checkpoint=tiny_model, limit=4, repeats=6, sampling=sampling
        )
        return evaluate(p)

    sampled, greedy = run("policy"), run("greedy")
    assert sampled["tasks"] == 4 and sampled["samples"] == {"solve": 24, "verify": 24}
    assert (sampled["sampling"], sampled["repeats"], sampled["top_p"]) == ("policy", 6, None)
    first = sampled["examples"][:3]  # episodes eval0.0, eval0.1, eval0.2: one task
    assert len({e["question"] for e in first}) == 1
    assert len({e["outputs"]["solve"][0] for e in first}) > 1  # the repeats sampled apart
    assert len({e["outputs"]["solve"][0] for e in greedy["examples"][:3]}) == 1
    assert run("policy")["examples"] == sampled["examples"]  # seeded


def test_an_agent_left_to_auto_is_evaluated_on_the_backend_a_run_would_choose(
    tmp_path: Path,
    tiny_model: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No `backend:` in the MEG: `evaluate` chooses as a run does (here hf: a 0.5 M model,
    short prompts, no GPU seen) and says so; the same MEG on `backend: hf` samples the
    same greedy answers."""
    from bench.peer_job import Job, meg_config

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU rule, on any machine
    cfg = meg_config(Job(2, 2, 4, 2), tiny_model, tmp_path, backend="auto")
    chosen = evaluate(EvalParams(config=str(cfg), base=True, limit=4))
    assert "backend: hf for policy: 0.5 M parameters" in capsys.readouterr().out
    fixed = meg_config(Job(2, 2, 4, 2), tiny_model, tmp_path, backend="hf")
    assert (
        evaluate(EvalParams(config=str(fixed), base=True, limit=4))["examples"]
        == (chosen["examples"])
    )
