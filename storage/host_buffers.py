"""Host buffers a state is staged in, one set per state key, allocated once and reused.

Why: a training-slot swap moves gigabytes between a GPU and host memory. Copying into fresh
pageable memory on every swap-out paid for the allocation, its page faults and the
driver's bounce through its own pinned staging area: a 0.5B agent's 6.33 GB state swapped
out and in at 4.4 GB/s on an H200, against ~55 GB/s for a plain copy through a pinned
buffer, and swap-out 3.8× slower than swap-in. Here the first swap-out of a key allocates
its buffers (page-locked when the state comes from a GPU), every later swap-out of that key
copies into the same buffers, and the copies are `non_blocking` (asynchronous DMA from and to
pinned memory), waited for once per state rather than once per tensor.

Ownership is never shared: a buffer set is either the pool's (holding a stored state, or
idle, waiting for its key's next swap-out) or handed to a caller by `take`, after which the
pool forgets it. So a state handed out without a copy (a `get` to host memory) can never be
overwritten by a later `put` of the same key.

Pinning needs CUDA; on a machine without it buffers are ordinary (reused all the same).
"""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]
Layout = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


def layout(tensors: Tensors) -> Layout:
    """Names, dtypes and shapes, in name order: buffers are reused only for the same one."""
    return tuple((k, v.dtype, tuple(v.shape)) for k, v in sorted(tensors.items()))


def _pinned(t: torch.Tensor) -> bool:
    """Whether a host copy of `t` should be page-locked: only for a GPU tensor (pinning
    costs more than it saves for a host-to-host copy, and needs CUDA)."""
    return t.device.type == "cuda"


class HostBuffers:
    """Per-key reusable host copies of tensor dicts (see the module docstring)."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensors] = {}
        self.allocations = 0  # buffer sets allocated so far (reuse shows as no increase)

    def stage(self, key: str, tensors: Tensors) -> Tensors:
        """Host copies of `tensors` in `key`'s buffers (allocated if there are none of this
        layout); returns the buffers, complete when this returns."""
        bufs = self._bufs.get(key)
        if bufs is None or layout(bufs) != layout(tensors):
            bufs = {
                k: torch.empty(v.shape, dtype=v.dtype, pin_memory=_pinned(v))
                for k, v in tensors.items()
            }
            self._bufs[key] = bufs
            self.allocations += 1
        queued: set[torch.device] = set()  # GPUs with asynchronous copies in flight
        with torch.no_grad():
            for k, v in tensors.items():
                asynchronous = v.device.type == "cuda" and bufs[k].is_pinned()
                bufs[k].copy_(v.detach(), non_blocking=asynchronous)
                if asynchronous:
                    queued.add(v.device)
        for device in queued:  # queued on each GPU's current stream: wait once per GPU
            torch.cuda.current_stream(device).synchronize()
        return bufs

    def take(self, key: str) -> None:
        """The caller now owns `key`'s buffers: the pool forgets them."""
        self._bufs.pop(key, None)

    def holds(self, key: str) -> bool:
        return key in self._bufs

    def nbytes(self) -> int:
        """Bytes of host memory the pool holds."""
        return sum(t.numel() * t.element_size() for b in self._bufs.values() for t in b.values())


def to_device(tensors: Tensors, device: str) -> Tensors:
    """Copies of `tensors` on `device`; from pinned buffers to a GPU asynchronously, on the
    current stream (whatever runs next on it sees the data; the buffers are not written
    again before the stream has read them, since a later `stage` queues behind it)."""
    with torch.no_grad():
        return {
            k: v.detach()
            .to(device, copy=True, non_blocking=v.is_pinned() and device != "cpu")
            .contiguous()
            for k, v in tensors.items()
        }
