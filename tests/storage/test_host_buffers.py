"""Host states are staged in buffers kept per key and reused, never shared with a caller.

Pinning and asynchronous copies need CUDA (none here): what runs here is the reuse and the
ownership rule; bench/gpu.py measures the swap on a GPU against a plain pinned copy."""

from __future__ import annotations

import torch

from storage.host_buffers import HostBuffers, layout
from storage.state import Device, Host, StateStore


def state(seed: int, rows: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(rows, 3, generator=g),
        "b": torch.randn(3, generator=g).to(torch.bfloat16),
        "step": torch.tensor(float(seed)),
    }


def ptrs(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    return {k: v.data_ptr() for k, v in tensors.items()}


def test_a_key_staged_again_reuses_its_buffers() -> None:
    """A GPU slot's swap-in copies the state to the device and leaves the buffers in the
    pool (idle), so the agent's next swap-out writes into the same memory. Here the state is
    deleted without a get, as the swap-in leaves it (a get to a GPU needs CUDA)."""
    store = StateStore("memory://unused")
    store.put("slots/a", state(1), {"v": 1})
    first, _ = store._memory["slots/a"]
    store.delete("slots/a")
    store.put("slots/a", state(2), {"v": 2})  # the next swap-out of the same agent
    second, meta = store._memory["slots/a"]
    assert store.host_buffers.allocations == 1 and meta == {"v": 2}
    assert ptrs(second) == ptrs(first)  # the same memory, new contents
    assert all(torch.equal(second[k], state(2)[k]) for k in second)


def test_a_cpu_swap_in_takes_the_buffers_without_a_copy() -> None:
    """On a CPU slot the trainer adopts the host buffers themselves (no copy at all); the
    next swap-out then stages into new buffers."""
    store = StateStore("memory://unused")
    store.put("slots/a", state(1))
    stored = ptrs(store._memory["slots/a"][0])
    got, _ = store.get("slots/a", to=Device("cpu"))
    store.delete("slots/a")
    assert ptrs(got) == stored and not store.host_buffers.holds("slots/a")
    store.put("slots/a", state(2))
    assert store.host_buffers.allocations == 2
    assert all(torch.equal(got[k], state(1)[k]) for k in got)


def test_a_state_handed_out_without_a_copy_is_never_overwritten() -> None:
    """`get(to=Host())` returns the stored tensors themselves; the pool then forgets them, so
    the key's next put allocates instead of writing into what the caller holds."""
    store = StateStore("memory://unused")
    store.put("k", state(1))
    held, _ = store.get("k", to=Host())
    store.put("k", state(2))
    assert all(torch.equal(held[k], state(1)[k]) for k in held)
    assert store.host_buffers.allocations == 2
    assert not set(ptrs(held).values()) & set(ptrs(store._memory["k"][0]).values())


def test_put_snapshots_even_into_reused_buffers() -> None:
    store = StateStore("memory://unused")
    live = state(1)
    store.put("k", live)
    live["w"].add_(1.0)  # an optimizer step after the swap-out
    got, _ = store.get("k", to=Device("cpu"))
    assert torch.equal(got["w"], state(1)["w"])


def test_another_layout_gets_new_buffers_and_release_frees_them() -> None:
    bufs = HostBuffers()
    a = bufs.stage("k", state(1))
    b = bufs.stage("k", state(1, rows=5))  # another shape: new buffers, never a resize
    assert bufs.allocations == 2 and layout(b) == layout(state(1, rows=5)) != layout(a)
    store = StateStore("memory://unused")
    store.put("k", state(1))
    store.delete("k")
    assert store.host_buffers.holds("k")  # idle, for the key's next swap-out
    store.release_buffers("k")
    assert not store.host_buffers.holds("k") and store.host_buffers.nbytes() == 0


def test_release_keeps_a_stored_state() -> None:
    store = StateStore("memory://unused")
    store.put("k", state(3))
    store.release_buffers("k")
    got, _ = store.get("k", to=Device("cpu"))
    assert torch.equal(got["w"], state(3)["w"])
