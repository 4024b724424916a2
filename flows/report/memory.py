"""`meg show`'s memory report: the parameters each worker holds, with and without sharing.

Placement is the pipeline's own at the start of a run (`flows.orchestrator.pipeline`): weight units
(`meg.sharing`) split over the rollout workers' hosts by the balancer's equal split, and
round-robin over the training workers. Per unit:

- rollout worker: an engine holds the base (+ one adapter per LoRA agent);
- training worker: a full agent holds weights + gradients + two AdamW moments (4×, whether
  resident in a slot or swapped out to the worker's host memory), all float32 whatever the
  agent's dtype (float32 masters); LoRA agents hold one frozen base in their dtype plus 4×
  their adapter each, in float32.

"Without sharing" is the same agents as full-weight copies: one engine and 4× the model per
agent. Parameters are counted from the safetensors headers (the base) and by peft on a
weightless copy of the model (the adapters); activations and the KV cache are not counted.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engines.families import checkpoint_shapes
from engines.rollout.balancer import equal_split
from flows.cluster.start import Workers
from flows.orchestrator.placement import host_worker, need_order, rollout_hosts
from meg import MEGSpec, is_hub_name, topological_order
from meg.sharing import WeightUnit, weight_units

TRAIN_COPIES = 4  # weights, gradients, AdamW exp_avg and exp_avg_sq
BYTES = {"float32": 4, "bfloat16": 2}
MASTER = BYTES["float32"]  # what trained weights, grads and AdamW moments are kept in


@dataclass(frozen=True, slots=True)
class Held:
    worker: str
    units: tuple[str, ...]
    shared: int  # parameters held as configured
    unshared: int  # parameters held if every agent had its own full copy
    nbytes: int  # `shared` in bytes: rollout at the units' dtypes, training float32 masters


def model_parameters(model: str) -> int:
    from engines.model_files import local_dir

    shapes = checkpoint_shapes(Path(local_dir(model)))
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def adapter_sizes(spec: MEGSpec, unit: WeightUnit) -> dict[str, int]:
    from engines.training.lora import LoraConfig, adapter_parameters

    out = {}
    for a in unit.agents:
        lora = spec.agents[a].lora
        cfg = LoraConfig.from_json(None if lora is None else lora.model_dump())
        out[a] = 0 if cfg is None else adapter_parameters(unit.model, cfg)
    return out


def held(
    spec: MEGSpec, rollout_workers: int = 1, train_workers: int = 1
) -> tuple[list[Held], list[Held]]:
    """(rollout workers, training workers) of the default placement."""
    order = topological_order(spec)
    agents = need_order(order, {n: spec.nodes[n].agent for n in order})
    units = {u.name: u for u in weight_units(spec, agents)}
    base = {name: model_parameters(u.model) for name, u in units.items()}
    adapters = {name: adapter_sizes(spec, u) for name, u in units.items() if u.lora}
    workers = Workers(
        "",
        tuple(f"rollout-{i}" for i in range(rollout_workers)),
        tuple(f"train-{i}" for i in range(train_workers)),
        {},
    )
    split = equal_split(list(units), rollout_hosts(workers, len(units)))
    on_rollout: dict[str, list[str]] = {w: [] for w in workers.rollout}
    for name, hosts in split.items():
        for w in dict.fromkeys(host_worker(h) for h in hosts):
            on_rollout[w].append(name)
    on_train: dict[str, list[str]] = {w: [] for w in workers.train}
    for i, name in enumerate(units):
        on_train[workers.train[i % train_workers]].append(name)

    def rollout_cost(name: str) -> tuple[int, int, int]:
        u = units[name]
        own = base[name] + sum(adapters.get(name, {}).values())
        return own, base[name] * len(u.agents), own * BYTES[u.dtype]

    def train_cost(name: str) -> tuple[int, int, int]:
        """Trained parameters are float32 masters whatever the dtype (engines.training);
        a LoRA base is frozen, in the unit's dtype."""
        u = units[name]
        if u.lora:
            trained = TRAIN_COPIES * sum(adapters[name].values())
            own, nbytes = base[name] + trained, base[name] * BYTES[u.dtype] + trained * MASTER
        else:
            own = TRAIN_COPIES * base[name]
            nbytes = own * MASTER
        return own, TRAIN_COPIES * base[name] * len(u.agents), nbytes

    def rows(
        placed: dict[str, list[str]], cost: Callable[[str], tuple[int, int, int]]
    ) -> list[Held]:
        out = []
        for w, names in placed.items():
            costs = [cost(n) for n in names]
            out.append(
                Held(
                    w,
                    tuple(names),
                    sum(c[0] for c in costs),
                    sum(c[1] for c in costs),
                    sum(c[2] for c in costs),
                )
            )
        return out

    return rows(on_rollout, rollout_cost), rows(on_train, train_cost)


def _m(n: int) -> str:
    return f"{n / 1e6:,.2f}M"


def report(spec: MEGSpec, rollout_workers: int = 1, train_workers: int = 1) -> str:
    """The table `meg show` prints (empty when a model is a hub name: nothing to read)."""
    if any(is_hub_name(spec.agents[a].model) for a in {n.agent for n in spec.nodes.values()}):
        return "weights per worker: not computed for hub models (read where downloaded)\n"
    rollout, train = held(spec, rollout_workers, train_workers)
    table = Table(title="parameters held per worker (weights; training: + grads + AdamW)")
    for col in ("worker", "weight units", "without sharing", "with sharing", "ratio", "bytes"):
        table.add_column(col, justify="left" if col in ("worker", "weight units") else "right")
    for h in rollout + train:
        ratio = h.shared / h.unshared if h.unshared else 1.0
        table.add_row(
            h.worker,
            ", ".join(h.units) or "-",
            _m(h.unshared),
            _m(h.shared),
            f"{ratio:.3f}",
            f"{h.nbytes / 2**20:,.1f} MiB",
        )
    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=False, color_system=None).print(table)
    return buf.getvalue()
