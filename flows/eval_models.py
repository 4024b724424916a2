"""Which models `flexmarl evaluate` loads, per agent: the config's initial models (`--base`),
a training run's (`final/<agent>/`, else its newest checkpoint exported to a temp dir), or one
HF model directory for every agent. Impossible choices are user errors (exit code 2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engines.model_files import local_dir
from flows.runs.record import RunError, load_run
from meg import MEGSpec


class EvalError(RunError):
    """The models to evaluate cannot be found: a user error (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Source:
    """Per agent: the HF model directory to load, and a label saying where it came from."""

    kind: str  # base | model | run
    models: dict[str, str]
    labels: dict[str, str]


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file()


def check_checkpoint(base: bool, checkpoint: str | None) -> None:
    """Reject an impossible choice of models before any server or model is started."""
    if base == (checkpoint is not None):
        raise EvalError("give exactly one of --checkpoint RUN_DIR|MODEL_DIR and --base")
    if checkpoint is None:
        return
    ck = Path(checkpoint)
    if not ck.is_dir():
        raise EvalError(
            f"checkpoint {ck} does not exist; give the --run-dir of a `flexmarl train` run "
            "or a HF model directory (with config.json)"
        )
    if not ((ck / "run.json").is_file() or _is_model_dir(ck)):
        raise EvalError(
            f"checkpoint {ck} is neither a flexmarl run directory (no run.json) nor a HF "
            "model directory (no config.json)"
        )


def _trained_agents(spec: MEGSpec) -> list[str]:
    return sorted({n.agent for n in spec.nodes.values()})


def _from_run(run_dir: Path, agents: list[str], tmp: Path) -> tuple[dict[str, str], dict[str, str]]:
    """`final/<agent>/` of a run (a LoRA adapter export merged into its base under `tmp`),
    else its newest checkpoint exported, merged, to `tmp/<agent>`."""
    from engines.training.checkpoint import export_hf, merged_model_dir, restore_trainer
    from engines.training.checkpoint_index import latest_checkpoint
    from engines.training.lora import is_adapter_dir

    run = load_run(run_dir)
    models, labels = {}, {}
    for agent in agents:
        final = run_dir / "final" / agent
        if _is_model_dir(final):
            models[agent], labels[agent] = str(final), f"final/{agent}"
            continue
        if is_adapter_dir(final) and agent in run.ctx.spec.agents:
            spec = run.ctx.spec.agents[agent]
            out = merged_model_dir(final, local_dir(spec.model), spec.dtype, tmp / agent)
            models[agent], labels[agent] = str(out), f"final/{agent} (adapter, merged)"
            continue
        if agent not in run.ctx.spec.agents:
            raise EvalError(f"run {run_dir} has no agent {agent!r} (it trained a different MEG)")
        ckpt = latest_checkpoint(run.ctx.checkpoint_root(agent))
        if ckpt is None:
            raise EvalError(
                f"run {run_dir} has neither final/{agent}/ nor a checkpoint of agent "
                f"{agent!r} under {run.ctx.checkpoint_root(agent)}; did the run finish a step?"
            )
        base_model = local_dir(run.ctx.spec.agents[agent].model)
        trainer = restore_trainer(ckpt, model_path=base_model)
        try:
            out = export_hf(trainer, tmp / agent, how="merged")
        finally:
            trainer.close()
        models[agent], labels[agent] = str(out), ckpt.rstrip("/").rsplit("/", 1)[1]
    return models, labels


def resolve_models(spec: MEGSpec, base: bool, checkpoint: str | None, tmp: Path) -> Source:
    """Per agent, the HF directory to evaluate: the config's models, a run's, or one model."""
    agents = _trained_agents(spec)
    if base:
        models = {a: spec.agents[a].model.removeprefix("hf://") for a in agents}
        return Source("base", models, {a: spec.agents[a].model for a in agents})
    ck = Path(str(checkpoint)).resolve()
    if (ck / "run.json").is_file():
        return Source("run", *_from_run(ck, agents, tmp))
    return Source("model", {a: str(ck) for a in agents}, {a: ck.name for a in agents})
