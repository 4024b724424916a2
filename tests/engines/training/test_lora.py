"""LoRA agents on peft: one shared base per process, only adapters train, swap, checkpoint
and export; what we write loads in peft, and a merged export equals the live policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from engines.training.bases import resident_bases, saved_name
from engines.training.batch import token_logprobs
from engines.training.checkpoint import export_hf, load_checkpoint, restore_trainer, save_checkpoint
from engines.training.lora import LoraConfig, adapter_parameters, read_adapter
from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import StateStore
from tests.engines.training.training_helpers import merge, random_batch

LORA = LoraConfig(r=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
CFG = TrainConfig(lr=1e-2, lora=LORA)
IDS = torch.tensor([[5, 9, 11, 20, 21, 22]])


def _train(tr: AgentTrainer, seed: int) -> None:
    mb = merge(random_batch(seed=seed, n=4))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    assert not tr.step().skipped


def _logits(tr: AgentTrainer) -> torch.Tensor:
    with torch.no_grad(), tr.policy.active():
        return tr.model(input_ids=IDS).logits


def _plain_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture
def trainers() -> list[AgentTrainer]:
    """Trainers a test builds; closed afterwards so no adapter outlives its test."""
    made: list[AgentTrainer] = []
    yield made
    for tr in made:
        tr.close()


def test_only_the_adapter_trains_and_names_are_peft_saved_names(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    tr = AgentTrainer("a", tiny_model, CFG)
    trainers.append(tr)
    torch.testing.assert_close(_logits(tr), _plain_logits(base))  # B = 0: a no-op at init
    w = tr.weights()
    assert len(w) == 2 * 2 * 2  # 2 layers × (q, v) × (A, B)
    assert all(k.startswith("base_model.model.model.layers.") for k in w)
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in w)
    assert all(k.startswith(("model/", "optim/", "rng/")) for k in tr.state())
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    _train(tr, 1)
    _train(tr, 2)
    for name, p in tr.model.named_parameters():
        if ".base_layer." in name or "lora_" not in name:
            hf = name.replace(".base_layer", "")
            assert torch.equal(p, frozen[hf]), name  # the base never moves
    assert not torch.allclose(_logits(tr), _plain_logits(base))  # the adapter learned
    assert tr.describe()["lora"]["r"] == 4


def test_agents_share_one_base_and_keep_their_own_adapters(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    before = resident_bases().get((tiny_model, "float32", "cpu"), 0)
    a = AgentTrainer("a", tiny_model, CFG)
    b = AgentTrainer("b", tiny_model, CFG)
    trainers += [a, b]
    assert resident_bases()[(tiny_model, "float32", "cpu")] == before + 2
    assert a.model is b.model  # one HF module tree, two adapters inside it
    _train(a, 3)
    b_before = _logits(b)
    _train(a, 4)
    torch.testing.assert_close(_logits(b), b_before, rtol=0, atol=0)  # b unaffected by a
    assert not torch.equal(_logits(a), b_before)
    a.close()
    trainers.remove(a)
    assert resident_bases()[(tiny_model, "float32", "cpu")] == before + 1
    _train(b, 5)  # the survivor still trains after the other adapter left


def test_swap_moves_only_the_adapter_bit_exactly(
    tiny_model: str, tmp_path: Path, trainers: list[AgentTrainer]
) -> None:
    slots = SlotManager(1, StateStore(f"file://{tmp_path}/s"))
    ref = AgentTrainer("a", tiny_model, CFG)  # the same steps without any swap
    trainers.append(ref)
    a = slots.acquire("a", lambda d: AgentTrainer("a", tiny_model, CFG, d))
    _train(a, 3)
    _train(ref, 3)
    before = {k: v.clone() for k, v in a.state().items()}
    slots.release("a")
    b = slots.acquire("b", lambda d: AgentTrainer("b", tiny_model, CFG, d))  # evicts a
    _train(b, 9)
    slots.release("b")
    a2 = slots.acquire("a", lambda d: AgentTrainer("a", tiny_model, CFG, d))
    after = a2.state()
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    _train(a2, 4)
    _train(ref, 4)
    for k, v in ref.weights().items():
        assert torch.equal(a2.weights()[k], v), k  # a swap changes nothing of the trajectory
    base_bytes = sum(
        p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(tiny_model).parameters()
    )
    per_swap = slots.stats.bytes_out / slots.stats.swaps_out
    assert 0 < per_swap < base_bytes / 10  # adapter + moments + RNG, never the base
    slots.close()


def test_checkpoint_is_a_peft_adapter_and_resumes_bit_exactly(
    tiny_model: str, tmp_path: Path, trainers: list[AgentTrainer]
) -> None:
    tr = AgentTrainer("a", tiny_model, CFG)
    trainers.append(tr)
    _train(tr, 4)
    ck = tmp_path / "ck"
    save_checkpoint(tr, str(ck))
    tensors, meta = load_checkpoint(str(ck))
    assert {k for k in tensors if k.startswith("model/")} == {f"model/{k}" for k in tr.weights()}
    assert meta["lora"]["r"] == 4 and (ck / "adapter_config.json").is_file()
    # the checkpoint directory is what peft loads
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), ck)
    torch.testing.assert_close(_plain_logits(peft_model), _logits(tr), rtol=1e-6, atol=1e-6)
    _train(tr, 5)
    resumed = restore_trainer(str(ck))
    trainers.append(resumed)
    assert resumed.config == CFG and resumed.version == 1
    _train(resumed, 5)
    for k, v in tr.state().items():
        assert torch.equal(resumed.state()[k], v), k


@pytest.mark.parametrize("how", ["adapter", "merged"])
def test_export_loads_in_peft_and_merged_equals_the_live_policy(
    tiny_model: str, tmp_path: Path, how: str, trainers: list[AgentTrainer]
) -> None:
    tr = AgentTrainer("a", tiny_model, CFG)
    trainers.append(tr)
    _train(tr, 6)
    out = export_hf(tr, tmp_path / "final", how=how)
    adapter_dir = out if how == "adapter" else out / "adapter"
    tensors, conf = read_adapter(adapter_dir)
    assert conf["peft_type"] == "LORA" and conf["r"] == 4 and conf["lora_alpha"] == 8
    assert sorted(conf["target_modules"]) == ["q_proj", "v_proj"]
    assert tensors.keys() == tr.weights().keys()
    assert json.loads((out / "flexmarl.json").read_text())["base_model"] == tiny_model
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), adapter_dir
    )
    torch.testing.assert_close(_plain_logits(loaded), _logits(tr), rtol=1e-6, atol=1e-6)
    if how == "merged":
        merged = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(_plain_logits(merged), _logits(tr), rtol=1e-5, atol=1e-5)
    else:
        assert not (out / "config.json").exists()  # an adapter, not a second base


def test_kl_reference_is_the_base_with_adapters_off(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    tr = AgentTrainer("a", tiny_model, TrainConfig(lr=1e-2, lora=LORA, kl_coef=0.1))
    trainers.append(tr)
    _train(tr, 7)  # the adapter moved: the policy is no longer the reference
    mb = merge(random_batch(seed=8, n=2))
    got = tr.reference_logprobs(mb)
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    with torch.no_grad():
        want = token_logprobs(base, mb.input_ids, mb.attention_mask, mb.response_mask)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    metrics = tr.accumulate(mb)
    assert metrics["kl"] > 0  # the trained adapter is measurably away from the base


def test_adapter_dropout_is_on_only_in_the_gradient_pass(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    cfg = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, dropout=0.5, target_modules=("q_proj",)))
    tr = AgentTrainer("a", tiny_model, cfg)
    trainers.append(tr)
    _train(tr, 1)  # B ≠ 0 now, so dropout on A's input changes the output
    drops = [
        m for n, m in tr.model.named_modules() if n.endswith(f"lora_dropout.{tr.policy.adapter}")
    ]
    assert drops and not any(d.training for d in drops)  # off again after the gradient pass
    torch.testing.assert_close(_logits(tr), _logits(tr), rtol=0, atol=0)  # eval: deterministic


def test_targets_are_checked_against_the_model(tiny_model: str) -> None:
    # 2 layers × q_proj (64 → 64) and v_proj (64 → 64), r = 4: r·(in + out) each
    assert adapter_parameters(tiny_model, LORA) == 2 * 2 * 4 * (64 + 64)
    with pytest.raises(ValueError, match="nope"):
        adapter_parameters(tiny_model, LoraConfig(target_modules=("nope",)))
    with pytest.raises(ValueError, match="nope"):
        AgentTrainer("a", tiny_model, TrainConfig(lora=LoraConfig(target_modules=("nope",))))
    with pytest.raises(ValueError, match="target_modules is empty"):
        LoraConfig(target_modules=())
    with pytest.raises(ValueError, match="'all-linear'"):
        LoraConfig(target_modules="all")
    assert saved_name("x.q_proj.lora_A.flexmarl3.weight", "flexmarl3") == "x.q_proj.lora_A.weight"
    assert saved_name("x.q_proj.lora_A.flexmarl3.weight", "flexmarl1") is None


def test_all_linear_and_the_architecture_default_resolve_to_module_names(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    default = AgentTrainer("a", tiny_model, TrainConfig(lora=LoraConfig()))
    every = AgentTrainer("b", tiny_model, TrainConfig(lora=LoraConfig(target_modules="all-linear")))
    trainers += [default, every]
    assert sorted(default.describe()["lora"]["target_modules"]) == ["q_proj", "v_proj"]
    every_names = every.describe()["lora"]["target_modules"]
    assert sorted({n.rsplit(".", 1)[-1] for n in every_names}) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    assert not any("lm_head" in n for n in every_names)  # all-linear leaves the head alone


def test_dropout_masks_belong_to_the_micro_batch_not_to_the_order(
    tiny_model: str, trainers: list[AgentTrainer]
) -> None:
    """With adapter dropout on, a step's micro-batches accumulated in either order, or after
    other code drew random numbers, give the same adapter bit for bit (the first two
    micro-batches of a step train in whichever order they arrive); the process's random
    stream is left as it was."""
    cfg = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, dropout=0.5, target_modules=("q_proj",)))
    parts = random_batch(seed=3, n=8)
    mbs = [merge(parts[:4]), merge(parts[4:])]

    def trained(name: str, order: tuple[int, ...], draw: bool = False) -> dict[str, torch.Tensor]:
        tr = AgentTrainer(name, tiny_model, cfg)
        trainers.append(tr)
        tr.begin_step(step=0)
        for j in order:
            if draw:
                torch.rand(7)  # someone else's random numbers between two micro-batches
            before = torch.get_rng_state()
            tr.accumulate(mbs[j], part=j)
            assert torch.equal(torch.get_rng_state(), before)
        assert not tr.step().skipped
        return {k: v.clone() for k, v in tr.weights().items()}

    first = trained("in-order", (0, 1))
    for got in (trained("reversed", (1, 0)), trained("drawn-between", (0, 1), draw=True)):
        assert got.keys() == first.keys()
        assert all(torch.equal(got[k], first[k]) for k in first)
    # dropout is really drawn: a step with no adapter dropout lands elsewhere
    plain = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, dropout=0.0, target_modules=("q_proj",)))
    tr = AgentTrainer("no-dropout", tiny_model, plain)
    trainers.append(tr)
    tr.begin_step(step=0)
    for j in (0, 1):
        tr.accumulate(mbs[j], part=j)
    tr.step()
    assert any(not torch.equal(v, first[k]) for k, v in tr.weights().items())
