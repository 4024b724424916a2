"""SlotManager: bit-exact swap through the StateStore, N agents on M slots, LRU, busy slots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.training.slots import SlotManager
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.state import Host, Location, StateStore, Url
from tests.engines.training.training_helpers import merge, random_batch

CFG = TrainConfig(lr=1e-3, aggregation="seq-mean-token-mean")


def _factory(agent: str, model: str):
    return lambda device: AgentTrainer(agent, model, CFG, device)


def _train(tr: AgentTrainer, seed: int) -> None:
    mb = merge(random_batch(seed=seed, n=4))
    tr.begin_step(mb.num_tokens, mb.num_seqs)
    tr.accumulate(mb)
    assert not tr.step().skipped


def _snapshot(tr: AgentTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tr.state().items() if k != "rng/cpu"}


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _location(kind: str, tmp_path: Path) -> Location:
    return Host() if kind == "host" else Url(f"file://{tmp_path}/offload")


@pytest.mark.parametrize("kind", ["host", "url"])
def test_swap_out_in_is_bit_exact(tiny_model: str, tmp_path: Path, kind: str) -> None:
    store = StateStore(f"file://{tmp_path}/states")
    where = _location(kind, tmp_path)
    slots = SlotManager(1, store, offload_to=where)
    a = slots.acquire("a", _factory("a", tiny_model))
    _train(a, 1)
    before = _snapshot(a)
    assert any(k.startswith("optim/") for k in before)
    slots.release("a")
    slots.acquire("b", _factory("b", tiny_model))  # evicts a
    assert slots.resident() == {0: "b"} and a.released
    assert store.where(SlotManager.state_key("a")) == where
    slots.release("b")
    a2 = slots.acquire("a", _factory("a", tiny_model))
    assert a2 is a and a.version == 1
    _assert_equal(_snapshot(a2), before)
    assert store.where(SlotManager.state_key("a")) is None  # one place only: the slot
    s = slots.stats
    assert (s.swaps_out, s.swaps_in, s.builds) == (2, 1, 2)
    assert s.bytes_out > 0 and s.bytes_in > 0


@pytest.mark.parametrize("kind", ["host", "url"])
def test_three_agents_on_one_slot_equal_dedicated(
    tiny_model: str, tmp_path: Path, kind: str
) -> None:
    agents = ["solver", "verifier", "judge"]
    dedicated = {ag: AgentTrainer(ag, tiny_model, CFG) for ag in agents}
    slots = SlotManager(1, StateStore(f"file://{tmp_path}/s"), offload_to=_location(kind, tmp_path))
    for step in range(2):
        for i, ag in enumerate(agents):
            seed = 100 * step + i
            _train(dedicated[ag], seed)
            tr = slots.acquire(ag, _factory(ag, tiny_model))
            _train(tr, seed)  # training after swaps continues exactly as without them
            slots.release(ag)
    for ag in agents:
        slots.evict(ag)
        tr = slots.acquire(ag, _factory(ag, tiny_model))
        assert tr.version == 2
        _assert_equal(_snapshot(tr), _snapshot(dedicated[ag]))
        slots.release(ag)
    assert slots.stats.builds == 3 and slots.stats.swaps_in >= 6


def test_lru_and_busy(tiny_model: str, tmp_path: Path) -> None:
    slots = SlotManager(2, StateStore(f"file://{tmp_path}/s"))
    for ag in ("a", "b"):
        slots.acquire(ag, _factory(ag, tiny_model))
    with pytest.raises(RuntimeError, match="all 2 slots are busy"):
        slots.acquire("c", _factory("c", tiny_model))
    slots.release("a")
    slots.release("b")
    slots.acquire("a", _factory("a", tiny_model))  # touch a: b is now least recently used
    slots.release("a")
    slots.acquire("c", _factory("c", tiny_model))
    assert sorted(a for a in slots.resident().values() if a) == ["a", "c"]
    with pytest.raises(RuntimeError, match="busy"):
        slots.evict("c")
    with pytest.raises(KeyError, match="holds no slot"):
        slots.release("b")
    with pytest.raises(ValueError, match="num_slots >= 1"):
        SlotManager(0, StateStore(f"file://{tmp_path}/s"))
    slots.release("c")  # a free slot by eviction, so the factory is what fails
    with pytest.raises(ValueError, match="built a trainer for 'x'"):
        slots.acquire("d", _factory("x", tiny_model))


def test_swap_in_the_middle_of_a_step_keeps_pending_gradients(
    tiny_model: str, tmp_path: Path
) -> None:
    """Agent a is swapped out between two micro-batches of its step (b needs the only slot);
    its accumulated gradients travel with its state, and the step equals an unswapped one."""
    store = StateStore(f"file://{tmp_path}/states")
    slots = SlotManager(1, store, offload_to=Host())
    reference = AgentTrainer("a", tiny_model, CFG)
    samples = random_batch(seed=5, n=6)
    parts = [merge(samples[:3]), merge(samples[3:])]
    reference.begin_step()
    for mb in parts:
        reference.accumulate(mb)
    expected = reference.step()

    a = slots.acquire("a", _factory("a", tiny_model))
    a.begin_step()
    a.accumulate(parts[0])
    slots.release("a")
    b = slots.acquire("b", _factory("b", tiny_model))  # evicts a mid-step
    _train(b, 9)
    slots.release("b")
    assert a.released
    a = slots.acquire("a", _factory("a", tiny_model))
    assert a.pending
    a.accumulate(parts[1])
    got = a.step()
    assert got.loss == pytest.approx(expected.loss, rel=1e-6)
    ref_w, got_w = reference.weights(), a.weights()
    for k in ref_w:
        assert torch.equal(got_w[k], ref_w[k]), k


def test_hand_over_moves_a_trained_state_to_another_workers_slots(
    tiny_model: str, tmp_path: Path
) -> None:
    """Two slot managers with their own StateStore index on one root stand for two worker
    processes: one trains the agent and hands it over, the other continues bit-exactly."""
    root = f"file://{tmp_path}/states"
    old, new = SlotManager(1, StateStore(root)), SlotManager(1, StateStore(root))
    a = old.acquire("a", _factory("a", tiny_model))
    _train(a, 1)
    before = _snapshot(a)
    with pytest.raises(RuntimeError, match="busy"):
        old.hand_over("a", Url(""))
    old.release("a")
    nbytes = old.hand_over("a", Url(""))
    assert nbytes > 0 and old.resident() == {0: None} and a.released
    assert new.state_store.where(SlotManager.state_key("a")) == Url(root)
    moved = new.acquire("a", _factory("a", tiny_model))  # a fresh trainer loads the state
    assert moved is not a and moved.version == 1
    _assert_equal(_snapshot(moved), before)
    assert new.state_store.where(SlotManager.state_key("a")) is None  # one place only
    assert old.hand_over("a", Url("")) == 0  # nothing left here: nothing handed over


def test_hand_over_of_a_swapped_out_agent_moves_its_stored_state(
    tiny_model: str, tmp_path: Path
) -> None:
    root = f"file://{tmp_path}/states"
    old, new = SlotManager(1, StateStore(root)), SlotManager(1, StateStore(root))
    a = old.acquire("a", _factory("a", tiny_model))
    _train(a, 2)
    before = _snapshot(a)
    old.release("a")
    old.acquire("b", _factory("b", tiny_model))  # evicts a to host memory
    old.release("b")
    assert old.state_store.where(SlotManager.state_key("a")) == Host()
    assert old.hand_over("a", Url("")) > 0
    assert old.resident() == {0: "b"}  # b stays
    _assert_equal(_snapshot(new.acquire("a", _factory("a", tiny_model))), before)
