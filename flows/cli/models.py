"""Commands for clusters of several hosts: `flexmarl model push` puts a model where every host
can read it, `flexmarl worker` starts a worker with its role."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.command_registry import command


def _push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", type=Path, help="a local HF model directory")
    p.add_argument("url", help="where to put it, e.g. s3://bucket/models/NAME")


@command(
    "model push",
    "Upload a model directory to a URL every worker can read (name that URL as the model).",
    _push_args,
)
def push_cmd(args: argparse.Namespace) -> int:
    from engines.model_files import push

    n = push(args.model_dir, args.url)
    print(f"{n} files of {args.model_dir} put at {args.url}; use `model: {args.url}`")
    return 0


def _worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scheduler", help="the scheduler's address, tcp://HOST:PORT or tls://HOST:PORT")
    p.add_argument(
        "--role",
        choices=("rollout", "train", "both"),
        required=True,
        help="what this worker runs: rollout tasks, training tasks, or both",
    )
    p.add_argument(
        "--name",
        help="the worker's name, unique in the cluster; a worker started later with the same "
        "name takes over its tasks (default: Dask's, and tasks stay with this process)",
    )
    p.add_argument("--host", help="the address to listen on (this host's, reachable by all)")
    p.add_argument("--memory-limit", help="e.g. 16GB (default: Dask's, the machine's RAM)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads of the worker process (default: OMP_NUM_THREADS and "
        "MKL_NUM_THREADS if this shell sets them, else 1; a training worker alone on its "
        "host may take every core)",
    )
    for flag, what in (("ca-file", "the CA"), ("cert", "this worker's certificate"),
                       ("key", "this worker's private key")):  # fmt: skip
        p.add_argument(f"--tls-{flag}", help=f"PEM file of {what}: TLS to the scheduler")


@command(
    "worker",
    "Start a Dask worker for FlexMARL: one thread, its role as a resource, the run settings.",
    _worker_args,
)
def worker_cmd(args: argparse.Namespace) -> int:
    """Replaces this process with `dask worker` (one task at a time: tasks own the cores
    they use; its torch on `--threads`) in the environment every worker of a run needs
    (flows.cluster.start.worker_env), its worker processes keeping glibc's malloc defaults as a
    local cluster's do."""
    import os
    import sys

    from flows.cluster.start import ROLLOUT, TRAIN, thread_env, worker_env
    from flows.runs.record import RunError

    if args.name in (ROLLOUT, TRAIN):
        raise RunError(f"--name {args.name!r} is a role; name the worker after its host")
    if args.threads is not None and args.threads < 1:
        raise RunError(f"--threads must be at least 1, got {args.threads}")
    roles = {"rollout": [ROLLOUT], "train": [TRAIN], "both": [ROLLOUT, TRAIN]}[args.role]
    # a resource named after the worker: the run pins its tasks to that name, not to an
    # address, so a replacement started with the same name (on any host) takes them over
    resources = [*roles, args.name] if args.name else roles
    # Dask's own `dask worker`, less the nanny's malloc setting (flows/cluster/dask_worker.py)
    argv = [sys.executable, "-m", "flows.cluster.dask_worker", args.scheduler]
    argv += ["--nthreads", "1", "--resources", ",".join(f"{r}=1" for r in resources)]
    argv += ["--name", args.name] if args.name else []
    for flag in ("host", "memory_limit", "tls_ca_file", "tls_cert", "tls_key"):
        if getattr(args, flag):
            argv += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if args.tls_cert:
        argv += ["--protocol", "tls"]
    argv += ["--no-dashboard"]
    sys.stdout.flush()
    # Dask's nanny gives its workers OMP/MKL_NUM_THREADS=1 unless its own environment has
    # them (its pre-spawn settings yield to the OS environment): `--threads` sets both here
    threads = thread_env(args.threads) if args.threads is not None else {}
    os.execve(sys.executable, argv, {**worker_env(), **os.environ, **threads})
    return 0  # pragma: no cover - execve does not return
