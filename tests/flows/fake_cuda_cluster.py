"""A named fake of dask-cuda's `LocalCUDACluster`, for machines without a GPU: a LocalCluster
whose spec for each next worker carries its own `CUDA_VISIBLE_DEVICES` (rotated over a fake
list of four GPUs), as dask-cuda's `new_worker_spec` does. Only that behaviour is faked."""

from __future__ import annotations

import copy
from typing import Any

from distributed import LocalCluster

FAKE_GPUS = ("0", "1", "2", "3")


class FakeCUDACluster(LocalCluster):  # type: ignore[misc]
    def new_worker_spec(self) -> dict[str, Any]:
        ((name, spec),) = super().new_worker_spec().items()
        i = len(self.worker_spec) % len(FAKE_GPUS)
        visible = ",".join(FAKE_GPUS[i:] + FAKE_GPUS[:i])
        spec = copy.deepcopy(spec)
        spec["options"]["env"] = {**spec["options"].get("env", {}), "CUDA_VISIBLE_DEVICES": visible}
        return {name: spec}
