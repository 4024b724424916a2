"""The `evaluate` flow: accuracy of the team and of each agent on held-out tasks.

Which models: a training run directory (`RUN_DIR/final/<agent>/`, the HF exports of the
train flow; without them the newest checkpoint in the run's store is exported to a temp
dir), a plain HF model directory (the same model for every agent), or `base=True`, the
config's own initial models (the before-RL baseline).

How: every MEG node runs in topological order over the split's tasks with ONE sample per
invocation — greedy by default, or with each agent's own sampling (`sampling="policy"`,
`repeats` episodes per task, each prompt its own seed: the distribution RL optimises) —,
planned with `meg.expand.plan_invocations` and prompted with
`prompt_ids` as the generate task does, then scored with the bound reward functions as the
score task does. All in this process: no Dask cluster, no store (a few batched passes).
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from prefect import flow

from flows.cluster.layout import visible_gpus
from flows.eval_agentic import Sampled, loop_finals, tool_samples
from flows.eval_models import EvalError, check_checkpoint, resolve_models
from flows.eval_params import EvalParams
from flows.runs.config import load_config
from flows.runs.engine_choice import choose_engines
from meg import MEGSpec, sinks, topological_order
from meg.expand import InvocationPlan, SampleInfo, plan_invocations
from tasks.gating import Shown, is_skipped
from tasks.scoring import Views, call_rewards
from workloads import resolve_config
from workloads.datasets import TaskItem, load_dataset

# Neither backend has an argmax mode (SamplingParams rejects temperature 0 on purpose), and
# a small temperature is not enough: vLLM raises any temperature below 0.01 to 0.01, and an
# untrained model's logits differ by less than that. Greedy is a top-p nucleus of one
# token instead: with top_p = 1e-6 both backends (hf's nucleus; vLLM's "cumulative
# probability <= 1 - p" mask, which always keeps the top token) keep only the argmax.
GREEDY_TOP_P = 1e-6


def eval_tasks(spec: MEGSpec, split: str, limit: int | None) -> tuple[TaskItem, ...]:
    splits = load_dataset(spec.dataset)
    items = splits.eval if split == "eval" else splits.train
    if not items:
        raise EvalError(f"the {split!r} split of {spec.name!r} is empty (dataset.eval_size: 0?)")
    return items[:limit] if limit else items


# ---- generation --------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _backend(name: str, path: str) -> Any:
    from engines.rollout.base import make_backend

    return make_backend(name, path)


def _tokenizer_path(spec: MEGSpec, agent: str, models: dict[str, str]) -> str:
    """The agent's tokenizer: its `tokenizer`, else the evaluated model's (a run's export
    carries a copy of the tokenizer it was trained with)."""
    return spec.agents[agent].tokenizer or models[agent]


def _prompt(
    spec: MEGSpec,
    node: str,
    plan: InvocationPlan,
    item: TaskItem,
    done: dict[str, Sampled],
    models: dict[str, str],
) -> list[int]:
    """Prompt ids of one invocation, built as a training rollout builds them
    (`engines.rollout.prompts`)."""
    from engines.rollout.prompts import invocation_prompt

    answers = [
        (
            parent,
            _tokenizer_path(spec, spec.nodes[parent].agent, models),
            [done[s.id].response_ids for s in samples],
        )
        for parent, samples in plan.inputs
    ]
    tok_path = _tokenizer_path(spec, spec.nodes[node].agent, models)
    return invocation_prompt(spec.nodes[node], tok_path, item.question, answers)


def run_node(
    spec: MEGSpec,
    node: str,
    tasks: dict[str, TaskItem],
    done: dict[str, Sampled],
    by_node: dict[str, dict[str, list[SampleInfo]]],
    models: dict[str, str],
    batch_size: int,
    sampling: str = "greedy",
) -> list[Sampled]:
    """All invocations of `node` over every episode: plan, prompt, generate (greedy, or
    with the agent's own sampling, one seed per prompt)."""
    from engines.rollout.base import SamplingParams
    from engines.tokenizers import tokenizer

    nspec = spec.nodes[node]
    agent = nspec.agent
    every: list[InvocationPlan] = []
    for eid in tasks:
        parents = {p: by_node[p][eid] for p in nspec.inputs}
        every.extend(plan_invocations(node, nspec, parents, eid))

    def shown(sid: str) -> Shown:
        return Shown(done[sid].text, done[sid].terminal, done[sid].skipped)

    skip = [is_skipped(nspec, plan, shown) for plan in every]
    gone = [
        Sampled(p, p.child_samples(1)[0], (), "", skipped=True)
        for p, s in zip(every, skip, strict=True)
        if s
    ]
    plans = [p for p, s in zip(every, skip, strict=True) if not s]
    tok = tokenizer(_tokenizer_path(spec, agent, models))
    if nspec.is_tool:
        return gone + tool_samples(spec, node, plans, tasks, done, tok)
    prompts = [_prompt(spec, node, plan, tasks[plan.episode], done, models) for plan in plans]
    eos = tok.eos_token_id
    own = spec.agents[agent].sampling
    greedy = sampling == "greedy"
    params = SamplingParams(
        n=1,
        temperature=1.0 if greedy else own.temperature,
        top_p=GREEDY_TOP_P if greedy else own.top_p,
        max_tokens=spec.node_max_tokens(node),
        seed=0,
        stop_token_ids=(eos,) if eos is not None else (),
    )
    backend = _backend(spec.agents[agent].backend, models[agent])
    out: list[Sampled] = []
    for start in range(0, len(prompts), batch_size):
        batch = dataclasses.replace(params, seed=start)  # a distinct seed for every prompt
        comps = backend.generate(prompts[start : start + batch_size], batch)
        for plan, (c,) in zip(plans[start : start + batch_size], comps, strict=True):
            score = float(np.mean(c.logprobs)) if c.logprobs else 0.0
            (info,) = plan.child_samples(1, [score])
            text = tok.decode(list(c.response_ids), skip_special_tokens=True)
            out.append(Sampled(plan, info, tuple(c.response_ids), text))
    return gone + out


def rollout(
    spec: MEGSpec,
    models: dict[str, str],
    tasks: dict[str, TaskItem],
    batch_size: int,
    sampling: str = "greedy",
) -> dict[str, list[Sampled]]:
    """Every node in topological order; children see their parents' samples."""
    done: dict[str, Sampled] = {}
    by_node: dict[str, dict[str, list[SampleInfo]]] = {}
    out: dict[str, list[Sampled]] = {}
    for node in topological_order(spec):
        samples = run_node(spec, node, tasks, done, by_node, models, batch_size, sampling)
        out[node] = samples
        done.update({s.info.id: s for s in samples})
        by_node[node] = {eid: [] for eid in tasks}
        for s in samples:
            by_node[node][s.plan.episode].append(s.info)
    return out


def score(
    spec: MEGSpec, samples: dict[str, list[Sampled]], tasks: dict[str, TaskItem]
) -> tuple[dict[str, np.ndarray], int]:
    """Reward of each sample per node from the bound reward functions (0 when unbound), run
    in reward processes as in training; a failed call scores 0. Also: how many failed."""
    views: Views = {eid: {} for eid in tasks}
    for node, rows in samples.items():
        for s in rows:
            views[s.plan.episode][s.info.id] = {
                "node": node,
                "text": s.text,
                "parents": list(s.plan.parent_ids()),
            }
    targets = [
        (node, s.plan.episode, s.info.id)
        for node, rows in samples.items()
        if node in spec.rewards
        for s in rows
        if not s.skipped
    ]
    outcomes = iter(call_rewards(spec, views, tasks, targets))
    out: dict[str, np.ndarray] = {}
    failed = 0
    for node, rows in samples.items():
        if spec.nodes[node].is_tool:  # the environment, not an agent: no reward here
            continue
        r = np.zeros(len(rows), np.float64)
        for i, s in enumerate(rows):
            if s.skipped:
                r[i] = np.nan  # never happened: no reward, not a zero
            elif node in spec.rewards:
                o = next(outcomes)
                failed += o.failed
                r[i] = 0.0 if o.failed else o.reward
        out[node] = r
    return out, failed


def examples(
    samples: dict[str, list[Sampled]], tasks: dict[str, TaskItem], k: int
) -> list[dict[str, Any]]:
    """The first `k` episodes as text: what each node said (for a human look)."""
    out = []
    for eid, item in list(tasks.items())[:k]:
        said = {n: [s.text for s in rows if s.plan.episode == eid] for n, rows in samples.items()}
        out.append({"question": item.question, "answer": item.answer, "outputs": said})
    return out


def _mean(x: np.ndarray) -> float:
    """The mean of the rewards that exist (a skipped sample's is NaN)."""
    x = x[np.isfinite(x)]
    return round(float(x.mean()), 4) if len(x) else 0.0


def evaluate(p: EvalParams) -> dict[str, Any]:
    """Greedy rewards per node, per agent and for the team on the chosen split."""
    t0 = time.time()
    check_checkpoint(p.base, p.checkpoint)
    spec, notes = choose_engines(  # in this process: its own machine
        load_config(p.config, check_models=p.base), visible_gpus(), own_cluster=True
    )
    for note in notes:
        print(note)
    items = eval_tasks(spec, p.split, p.limit)
    tasks = {
        f"eval{i}" if p.repeats == 1 else f"eval{i}.{r}": item
        for i, item in enumerate(items)
        for r in range(p.repeats)
    }
    with tempfile.TemporaryDirectory(prefix="flexmarl-eval-") as tmp:
        try:
            source = resolve_models(spec, p.base, p.checkpoint, Path(tmp))
            samples = rollout(spec, source.models, tasks, p.batch_size, p.sampling)
        finally:
            _backend.cache_clear()  # engines die with the evaluation (temp exports go)
    rewards, failed = score(spec, samples, tasks)
    by_id = {s.info.id: s for rows in samples.values() for s in rows}
    per_agent: dict[str, list[np.ndarray]] = {}
    for node, r in rewards.items():
        per_agent.setdefault(spec.nodes[node].agent, []).append(r)
    team_nodes = list(spec.team_nodes or sinks(spec))
    team = [_mean(rewards[n]) for n in team_nodes if np.isfinite(rewards[n]).any()]
    out = {
        "workload": spec.name,
        "config": str(resolve_config(p.config)),
        "source": source.kind,
        "checkpoint": p.checkpoint,
        "models": source.labels,
        "split": p.split,
        "tasks": len(items),
        "sampling": p.sampling,
        "repeats": p.repeats,
        "top_p": GREEDY_TOP_P if p.sampling == "greedy" else None,
        "samples": {n: int(np.isfinite(r).sum()) for n, r in rewards.items()},  # taken
        "node_agent": {n: spec.nodes[n].agent for n in rewards},
        "node_reward": {n: _mean(r) for n, r in rewards.items()},
        "agent_reward": {a: _mean(np.concatenate(rs)) for a, rs in sorted(per_agent.items())},
        "team_nodes": team_nodes,
        "team_reward": round(float(np.mean(team)), 4) if team else 0.0,
        "failed_rewards": failed,  # reward calls that raised or timed out, scored 0
        "skipped": {n: sum(s.skipped for s in samples[n]) for n in rewards},
        "loops": loop_finals(
            spec,
            {n: [s.info.id for s in samples[n]] for n in rewards},
            lambda sid: dict(by_id[sid].info.lineage),
            rewards,
            lambda sid: by_id[sid].skipped,
        ),
        "examples": examples(samples, tasks, 3),
        "wall_s": round(time.time() - t0, 2),
    }
    if p.json_path:
        Path(p.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(p.json_path).write_text(json.dumps(out, indent=2))
    return out


def _how(result: dict[str, Any]) -> str:
    if result.get("sampling", "greedy") == "greedy":
        return "greedy"
    repeats = result.get("repeats", 1)
    return "sampled" + (f" ×{repeats}" if repeats > 1 else "")


def table(result: dict[str, Any]) -> Any:
    """A rich table: one row per node, per agent, and the team."""
    from rich.table import Table

    t = Table(
        title=f"{result['workload']} · {_how(result)} on {result['tasks']} {result['split']} tasks "
        f"({result['source']})"
    )
    for col in ("scope", "name", "model", "samples", "mean reward"):
        t.add_column(col, justify="right" if col in ("samples", "mean reward") else "left")
    models = result["models"]
    for node, r in result["node_reward"].items():
        model = models.get(result["node_agent"][node], "")
        t.add_row("node", node, model, str(result["samples"][node]), f"{r:.3f}")
    for agent, r in result["agent_reward"].items():
        t.add_row("agent", agent, models.get(agent, ""), "", f"{r:.3f}")
    t.add_row("team", "+".join(result["team_nodes"]), "", "", f"{result['team_reward']:.3f}")
    for chain, f in result.get("loops", {}).items():  # a loop's final round, per rollout
        rollouts = str(int(f["rollouts"]))
        t.add_row("loop final", chain, "", rollouts, f"{f['final_reward']:.3f}")
        t.add_row("loop solved", chain, "", rollouts, f"{f['solved']:.3f}")
        failed = str(int(f.get("first_failed", 0)))
        t.add_row("loop repaired", chain, "", failed, f"{f.get('repaired', 0.0):.3f}")
    return t


@flow(name="flexmarl-evaluate", log_prints=True)
def evaluate_flow(params: EvalParams = EvalParams(base=True)) -> dict[str, Any]:  # noqa: B008
    """Greedy accuracy of the team and of each agent on the held-out split."""
    from prefect.artifacts import create_table_artifact

    out = evaluate(params)
    rows = [{"scope": "node", "name": n, "reward": r} for n, r in out["node_reward"].items()]
    rows += [{"scope": "agent", "name": a, "reward": r} for a, r in out["agent_reward"].items()]
    rows.append(
        {"scope": "team", "name": "+".join(out["team_nodes"]), "reward": out["team_reward"]}
    )
    create_table_artifact(
        rows,
        key=re.sub(r"[^a-z0-9-]", "-", f"eval-{out['workload'].lower()}"),
        description="greedy evaluation",
    )
    print(f"team reward {out['team_reward']:.3f} on {out['tasks']} {out['split']} tasks")
    return out
