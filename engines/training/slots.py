"""On-demand training slots: N agents share M ≤ N slots; states swap through the StateStore.

FlexMARL's answer to dynamic training demand: an agent needs training
hardware only while a micro-batch of its data is ready. `acquire(agent, factory)` binds the
agent to a slot — the slot it already holds, a free one, or the slot of the least-recently
used *idle* agent, whose state is swapped out first. An agent is *busy* from `acquire` to
`release`, and a busy agent is never evicted. An idle agent may be swapped out between two
micro-batches of a step: its pending gradients are part of its state (`grad/...`,
`AgentTrainer.state`) and come back with it.

Swap-out: `state()` → `StateStore.put(f"slots/{agent}", at=offload_to)` → `release()` (the
trainer drops its tensors, keeping only module objects). Swap-in: `StateStore.get(key,
to=Device(slot))` → `load_state` → `StateStore.delete(key)`, so a state lives in exactly
one place and nothing aliases the tensors being trained. Where the state was (host memory,
an fsspec URL, another worker) is the store's business: this module never branches on it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.training.trainer import AgentTrainer
from storage.state import Device, Host, Location, StateStore

TrainerFactory = Callable[[str], AgentTrainer]  # device → a fresh trainer for the agent


@dataclass(slots=True)
class SwapStats:
    swaps_out: int = 0
    swaps_in: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    swap_out_s: float = 0.0
    swap_in_s: float = 0.0
    builds: int = 0  # trainers constructed by a factory (model loaded from its path)


@dataclass(slots=True)
class _Slot:
    device: str
    agent: str | None = None
    busy: bool = False


@dataclass(slots=True)
class SlotManager:
    """M slots (one device string each) for any number of agents, LRU eviction."""

    num_slots: int
    state_store: StateStore
    offload_to: Location = field(default_factory=Host)
    devices: tuple[str, ...] = ()
    stats: SwapStats = field(default_factory=SwapStats)
    _slots: list[_Slot] = field(default_factory=list)
    _trainers: dict[str, AgentTrainer] = field(default_factory=dict)  # also swapped-out shells
    _lru: OrderedDict[str, None] = field(default_factory=OrderedDict)  # resident, oldest first

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"SlotManager needs num_slots >= 1, got {self.num_slots}")
        devs = self.devices or ("cpu",) * self.num_slots
        if len(devs) != self.num_slots:
            raise ValueError(f"devices has {len(devs)} entries for {self.num_slots} slots")
        self._slots = [_Slot(d) for d in devs]

    @staticmethod
    def state_key(agent: str) -> str:
        return f"slots/{agent}"

    def resident(self) -> dict[int, str | None]:
        """Slot index → agent bound to it (None when free)."""
        return {i: s.agent for i, s in enumerate(self._slots)}

    def acquire(self, agent: str, factory: TrainerFactory) -> AgentTrainer:
        """Bind `agent` to a slot and mark it busy; returns its trainer, state loaded."""
        slot = self._slot_of(agent)
        if slot is None:
            slot = self._free_slot() or self._evict_lru()
            self._swap_in(agent, slot, factory)
        slot.busy = True
        self._lru.pop(agent, None)
        self._lru[agent] = None  # most recently used last
        return self._trainers[agent]

    def release(self, agent: str) -> None:
        """The agent stays resident but may be evicted when another agent needs its slot."""
        slot = self._slot_of(agent)
        if slot is None:
            raise KeyError(f"agent {agent!r} holds no slot; resident: {self.resident()}")
        slot.busy = False

    def forget(self, agent: str) -> None:
        """Drop `agent`'s trainer and any stored state: the next `acquire` rebuilds it with
        the factory. For a trainer left inconsistent by a failure mid-update (a backward
        that raised, a step whose publication failed): rebuilding from the checkpoint and
        the store is the only state known to be right."""
        slot = self._slot_of(agent)
        if slot is not None:
            slot.agent, slot.busy = None, False
        trainer = self._trainers.pop(agent, None)
        if trainer is not None:
            trainer.close()  # a LoRA adapter leaves its shared base
        self._lru.pop(agent, None)
        if self.state_store.where(self.state_key(agent)) is not None:
            self.state_store.delete(self.state_key(agent))
        self.state_store.release_buffers(self.state_key(agent))  # its reused host buffers

    def hand_over(self, agent: str, to: Location) -> int:
        """Put `agent`'s state at `to` and let go of it: another worker's slots take it from
        there (elastic training allocation). The agent must be idle. Returns the bytes handed
        over; 0 when this manager has no state of the agent (a restarted worker): the next
        worker then builds it from its checkpoint and the store, as after a crash."""
        key = self.state_key(agent)
        trainer, slot = self._trainers.get(agent), self._slot_of(agent)
        if trainer is None:
            return 0
        if slot is not None and slot.busy:
            raise RuntimeError(f"agent {agent!r} is busy (acquired, not released); cannot move")
        if slot is not None:
            ref = self.state_store.put(key, trainer.state(), trainer.meta(), at=to)
            slot.agent = None
        elif self.state_store.where(key) is not None:
            ref = self.state_store.move(key, to)
        else:
            self.forget(agent)
            return 0
        self._trainers.pop(agent)
        trainer.close()
        self._lru.pop(agent, None)
        self.state_store.release_buffers(key)
        self.stats.swaps_out += 1
        self.stats.bytes_out += ref.nbytes
        return ref.nbytes

    def close(self) -> None:
        """Forget every agent (a worker dropping a finished run's trainers)."""
        for agent in list(self._trainers):
            self.forget(agent)

    def evict(self, agent: str) -> None:
        """Swap `agent` out now (e.g. before a planned shutdown); it must be idle."""
        slot = self._slot_of(agent)
        if slot is None:
            return
        if slot.busy:
            raise RuntimeError(f"agent {agent!r} is busy (acquired, not released); cannot evict")
        self._swap_out(slot)

    # ---- internals ------------------------------------------------------------------------
    def _slot_of(self, agent: str) -> _Slot | None:
        return next((s for s in self._slots if s.agent == agent), None)

    def _free_slot(self) -> _Slot | None:
        return next((s for s in self._slots if s.agent is None), None)

    def _evict_lru(self) -> _Slot:
        for victim in self._lru:  # oldest first
            slot = self._slot_of(victim)
            if slot is not None and not slot.busy:
                self._swap_out(slot)
                return slot
        raise RuntimeError(
            f"all {self.num_slots} slots are busy ({self.resident()}); release an agent first"
        )

    def _swap_out(self, slot: _Slot) -> None:
        agent = slot.agent
        if agent is None:
            return
        t0 = time.perf_counter()
        trainer = self._trainers[agent]
        ref = self.state_store.put(
            self.state_key(agent), trainer.state(), trainer.meta(), at=self.offload_to
        )
        trainer.release()
        self.stats.swaps_out += 1
        self.stats.bytes_out += ref.nbytes
        self.stats.swap_out_s += time.perf_counter() - t0
        slot.agent, slot.busy = None, False
        self._lru.pop(agent, None)

    def _swap_in(self, agent: str, slot: _Slot, factory: TrainerFactory) -> None:
        key = self.state_key(agent)
        trainer = self._trainers.get(agent)
        stored = self.state_store.where(key) is not None
        if trainer is None:
            trainer = factory(slot.device)
            self.stats.builds += 1
            if trainer.agent != agent:
                raise ValueError(f"factory built a trainer for {trainer.agent!r}, not {agent!r}")
            self._trainers[agent] = trainer
        if stored:
            t0 = time.perf_counter()
            tensors, meta = self.state_store.get(key, to=Device(slot.device))
            trainer.load_state(tensors, meta, device=slot.device)
            self.state_store.delete(key)
            self.stats.swaps_in += 1
            self.stats.bytes_in += sum(t.numel() * t.element_size() for t in tensors.values())
            self.stats.swap_in_s += time.perf_counter() - t0
        elif trainer.released:
            raise RuntimeError(f"agent {agent!r}: state {key!r} is not in the StateStore")
        elif trainer.device.type != slot.device.split(":")[0]:
            raise RuntimeError(f"agent {agent!r} has no stored state to move to {slot.device}")
        slot.agent = agent
