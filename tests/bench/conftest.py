"""What the benchmarks' small runs share: one Dask cluster per test process (the benchmarks
that run every arm on one default cluster take its address, `--scheduler`), and one
long-tail model warm-started 20 steps (the engine benchmarks' prompts), built once for
every test process of the session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from filelock import FileLock

LONGTAIL_WARM_STEPS = 20


@pytest.fixture(scope="session")
def bench_cluster(prefect_server: str) -> Iterator[str]:
    """Scheduler address of a default local cluster (1 rollout + 1 training worker, as
    `ClusterConfig()` starts it): the benchmarks' shared-cluster arms run there, run after run,
    as on any long-lived cluster (each run its own store; hosts are keyed by run)."""
    from flows.cluster.start import ClusterConfig, dask_cluster

    with dask_cluster(ClusterConfig()) as workers:
        yield workers.address


@pytest.fixture(scope="session")
def longtail_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny model warm-started `LONGTAIL_WARM_STEPS` steps on the long-tail format, built
    once for the session: pytest-xdist's workers share the folder above their own temporary
    folders, and a file lock lets the first one build it while the others wait. At 20 steps
    the model ends its lists at varied lengths (what `bench.cut` and `bench.srt` are about);
    the seeded build is the same whichever worker makes it."""
    from bench.longtail import build_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the session's folder, shared by every worker
        root = root.parent
    done = root / f"longtail-warm{LONGTAIL_WARM_STEPS}"
    with FileLock(str(done) + ".lock"):
        if not done.is_dir():
            part = root / f"{done.name}.part-{os.getpid()}"
            shutil.rmtree(part, ignore_errors=True)
            build_model("longtail", part, LONGTAIL_WARM_STEPS)
            part.rename(done)  # whole or absent: a failed build leaves no model behind
    return str(done / "model-longtail")
