"""LoRA: only the adapter trains, swaps and publishes; merge and PEFT export are exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from engines.training.checkpoint import export_hf, restore_trainer, save_checkpoint
from engines.training.lora import LoraConfig
from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import StateStore
from tests.engines.training.training_helpers import merge, random_batch

LORA = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
IDS = torch.tensor([[5, 9, 11, 20, 21, 22]])


def _train(tr: AgentTrainer, seed: int) -> None:
    mb = merge(random_batch(seed=seed, n=4))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    assert not tr.step().skipped


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_only_adapter_trains_and_merge_is_exact(tiny_model: str) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    tr = AgentTrainer("a", tiny_model, LORA)
    torch.testing.assert_close(_logits(tr.model), _logits(base))  # B = 0: a no-op at init
    w = tr.weights()
    assert len(w) == 2 * 2 * 2  # 2 layers × (q, v) × (A, B)
    assert all(k.startswith("base_model.model.model.layers.") for k in w)
    assert all(k.startswith(("model/", "optim/", "rng/")) for k in tr.state())
    assert not any("embed_tokens" in k for k in tr.state())
    frozen_before = {k: v.clone() for k, v in base.state_dict().items()}
    _train(tr, 1)
    _train(tr, 2)
    sd = tr.model.state_dict()
    for k, v in frozen_before.items():
        assert torch.equal(sd[k], v), k  # base untouched
    assert not torch.allclose(_logits(tr.model), _logits(base))  # the adapter learned
    base.load_state_dict(tr.merged_weights())
    torch.testing.assert_close(_logits(base), _logits(tr.model), rtol=1e-5, atol=1e-5)


def test_base_is_shared_between_agents(tiny_model: str) -> None:
    a = AgentTrainer("a", tiny_model, LORA)
    b = AgentTrainer("b", tiny_model, LORA)
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    name = "model.embed_tokens.weight"
    assert pa[name].data_ptr() == pb[name].data_ptr()
    lora = "model.layers.0.self_attn.q_proj.lora_A.weight"
    assert pa[lora].data_ptr() != pb[lora].data_ptr()


def test_swap_moves_only_the_adapter(tiny_model: str, tmp_path: Path) -> None:
    slots = SlotManager(1, StateStore(f"file://{tmp_path}/s"))
    a = slots.acquire("a", lambda d: AgentTrainer("a", tiny_model, LORA, d))
    _train(a, 3)
    before = {k: v.clone() for k, v in a.state().items() if k != "rng/cpu"}
    slots.release("a")
    slots.acquire("b", lambda d: AgentTrainer("b", tiny_model, LORA, d))
    slots.release("b")
    a2 = slots.acquire("a", lambda d: AgentTrainer("a", tiny_model, LORA, d))
    after = a2.state()
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    full_bytes = sum(p.numel() * 4 for p in a2.model.parameters())
    assert slots.stats.bytes_out < full_bytes / 4  # adapter + moments, not the base


def test_checkpoint_and_export(tiny_model: str, tmp_path: Path) -> None:
    tr = AgentTrainer("a", tiny_model, LORA)
    _train(tr, 4)
    save_checkpoint(tr, str(tmp_path / "ck"))
    _train(tr, 5)
    resumed = restore_trainer(str(tmp_path / "ck"))
    assert resumed.config == LORA
    _train(resumed, 5)
    for k, v in tr.state().items():
        assert torch.equal(resumed.state()[k], v), k
    out = export_hf(tr, tmp_path / "hf")
    plain = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_logits(plain), _logits(tr.model), rtol=1e-5, atol=1e-5)
    conf = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert conf["peft_type"] == "LORA" and conf["r"] == 4 and conf["lora_alpha"] == 8
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == tr.weights().keys()


def test_lora_config_errors(tiny_model: str) -> None:
    with pytest.raises(ValueError, match="target_modules is empty"):
        LoraConfig(target_modules=())
    with pytest.raises(ValueError, match=r"matched no nn\.Linear"):
        AgentTrainer("a", tiny_model, TrainConfig(lora=LoraConfig(target_modules=("nope",))))
