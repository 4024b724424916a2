"""Gradients where the rows were sampled: a one-node agent's micro-batch is back-propagated
inside its generate task, on this rollout worker's copy of the trainer's model at the
version the rows were sampled with, and the optimizer step adds the parts.

Why: on a one-agent on-policy job the trainer is the critical path twice over. Every
micro-batch's rows travel to one training worker and are back-propagated there one after
the other, while the rollout workers that sampled them sit idle; and a training task on
two threads slows down 2–5x when anything runs beside it (torch's threads wait for each
other at every operator). Here each rollout worker back-propagates the micro-batch it has
just sampled and scored, on its own thread, at the same time as the others; the training
worker only adds the gradients and steps (`AgentTrainer.add_part`).

The same gradient: a part is the un-normalised sum of its rows' per-token gradients
(streaming normalisation: `engines.training.accum`), with the part's own random stream
(`part_rng`: seed, version, part), so where it was computed changes nothing but float
summation order across thread counts. A part is used only when it was computed at exactly
the version the trainer holds and over exactly the rows the trainer would train; anything
else (async rows from an older version, a trainer rebuilt after a worker died) is
back-propagated on the trainer as before (`tasks.training`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from engines.model_files import local_dir
from engines.training.publish import weights_key
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.schema import SampleBatch
from storage.state import Host as HostMem
from tasks.accounting import accumulate_part
from tasks.context import RunContext
from tasks.refs import GradPart
from tasks.worker import slot_devices, state_of

_LOCK = threading.Lock()
_REPLICAS: dict[tuple[str, str], AgentTrainer] = {}  # (run id, agent) → this worker's copy


def replica_of(ctx: RunContext, agent: str) -> AgentTrainer:
    """This worker's copy of `agent`'s trainer for the run (its optimizer is never stepped);
    other runs' copies are dropped when a new run asks."""
    key = (ctx.run_id, agent)
    with _LOCK:
        if key not in _REPLICAS:
            for old in [k for k in _REPLICAS if k[0] != ctx.run_id]:
                _REPLICAS.pop(old).close()
            config = TrainConfig.from_agent(ctx.spec.agents[agent], seed=ctx.seed)
            # the worker's own device, as its training slots get (a GPU worker's first GPU)
            device = slot_devices(1)[0]
            _REPLICAS[key] = AgentTrainer(
                agent, local_dir(ctx.spec.agents[agent].model), config, device
            )
        return _REPLICAS[key]


def gradient_part(
    ctx: RunContext, agent: str, step: int, mb: int, version: int, batch: SampleBatch
) -> GradPart:
    """Back-propagate `batch`, micro-batch `mb` of `step`, at the published `version`."""
    t0 = time.perf_counter()
    rep = replica_of(ctx, agent)
    if rep.version != version:
        tensors, _ = state_of(ctx).get(weights_key(agent, version), to=HostMem())
        rep.policy.assign(tensors)
        rep.version = version
    rep.begin_step(step=step)
    try:
        accumulate_part(ctx, rep, agent, step, mb, batch)
        acc = rep.pending_accum()
        assert acc is not None
        # numpy, not tensors: a pickled tensor goes through torch.save's zip format, an
        # array through pickle 5's out-of-band buffers (Dask copies the bytes once)
        grads = {
            n: p.grad.cpu().numpy() for p, n in rep.policy.trainable.items() if p.grad is not None
        }
        for p in rep.policy.trainable:
            p.grad = None  # handed over: the next part starts from none
    finally:
        rep.set_pending(None)
    return GradPart(agent, step, mb, version, acc.to_json(), grads, time.perf_counter() - t0)


def grad_part(
    after: tuple[Any, ...], agent: str, step: int, mb: int, version: int, counts: tuple[int, int]
) -> GradPart | None:
    """The part a generate task in `after` computed for (agent, step, mb), if a trainer at
    `version` may add it: computed at exactly that version, over rows of exactly `counts`
    (response tokens, rows: those the trainer would back-propagate)."""
    for r in after:
        part = getattr(r, "grad", None)
        if not isinstance(part, GradPart):
            continue
        held = {int(j): (int(t), int(q)) for j, t, q in part.accum["parts"]}
        which = (part.agent, part.step, part.micro_batch, part.version)
        if which == (agent, step, mb, version) and held == {mb: counts}:
            return part
    return None
