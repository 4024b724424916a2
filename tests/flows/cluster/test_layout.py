"""The layout a run gets when it names none (flows.cluster.layout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cluster.layout import default_layout, describe, engine_bytes, for_meg, usable_cores
from flows.cluster.start import ClusterConfig

GIB = 1 << 30


def layout(
    cfg: ClusterConfig, agents: int, mode: str, mbs: int, units: int | None = None
) -> ClusterConfig:
    """`default_layout` for a 1 GiB engine on a 64 GiB machine (memory never binds); every
    agent has weights of its own unless `units` says fewer."""
    return default_layout(cfg, agents, units or agents, mode, mbs, per_engine=GIB, ram=64 * GIB)


def test_a_one_agent_on_policy_run_spreads_over_the_cores() -> None:
    cfg = layout(ClusterConfig(cores=4), 1, "flex", 2)
    assert (cfg.rollout_workers, cfg.train_threads, cfg.train_workers) == (2, 4, 1)
    assert cfg.threads is None and not cfg.colocate and cfg.scheduler is None
    wide = layout(ClusterConfig(cores=4), 1, "sync", 8)  # one rollout worker per core
    assert (wide.rollout_workers, wide.train_threads) == (4, 4)
    assert layout(wide, 1, "sync", 8) is wide  # chosen once: its fields are set now


@pytest.mark.parametrize(
    ("given", "agents", "mode"),
    [
        (ClusterConfig(cores=4), 1, "async"),  # async: rollout overlaps training already
        (ClusterConfig(cores=4), 3, "async"),
        (ClusterConfig(cores=1), 1, "flex"),  # one core: nothing to spread
        (ClusterConfig(cores=4, scheduler="tcp://127.0.0.1:1"), 1, "flex"),  # not ours
        (ClusterConfig(cores=4, colocate=True), 1, "flex"),
        (ClusterConfig(cores=4, rollout_workers=1), 1, "flex"),  # the user chose, even the default
        (ClusterConfig(cores=4, train_threads=1), 1, "flex"),
        (ClusterConfig(cores=4, memory_limit="2GiB"), 1, "flex"),
        (ClusterConfig(cores=4, cluster_class="dask_cuda.LocalCUDACluster"), 1, "flex"),
    ],
)
def test_every_other_run_keeps_its_cluster(given: ClusterConfig, agents: int, mode: str) -> None:
    assert layout(given, agents, mode, 2) is given


def test_the_cores_default_to_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})
    assert usable_cores() == 3
    assert layout(ClusterConfig(), 1, "flex", 4).train_threads == 3


def test_memory_bounds_the_rollout_engines(tiny_model: str) -> None:
    """Half the RAM for all engines: a 10 GiB engine on a 64 GiB machine of 16 cores gets 3
    rollout workers, not 16; one that does not fit still gets one; a model whose size is
    unknown (nothing to measure) keeps the cluster it was given."""
    wide = ClusterConfig(cores=16)
    assert default_layout(wide, 1, 1, "flex", 16, 10 * GIB, 64 * GIB).rollout_workers == 3
    assert default_layout(wide, 1, 1, "flex", 16, 80 * GIB, 64 * GIB).rollout_workers == 1
    assert default_layout(wide, 1, 1, "flex", 16, None, 64 * GIB) is wide
    assert default_layout(wide, 8, 8, "flex", 2, 10 * GIB, 64 * GIB).rollout_workers == 3
    assert default_layout(wide, 8, 8, "flex", 2, 40 * GIB, 64 * GIB) is wide  # one engine
    size = engine_bytes(tiny_model)
    weights = sum(f.stat().st_size for f in Path(tiny_model).glob("*.safetensors"))
    assert size is not None and size > 2 * weights
    assert engine_bytes(Path(tiny_model).parent / "no-such-model") is None


def test_the_line_it_prints_names_the_layout_and_the_way_out() -> None:
    line = describe(layout(ClusterConfig(cores=4), 1, "flex", 2), 1, 2)
    assert line.startswith("layout: one agent, on-policy, 4 cores: 2 rollout worker(s)")
    assert "training worker of 4 thread(s)" in line
    assert "--rollout-workers" in line and "--micro-batches 4" in line
    assert "--micro-batches" not in describe(layout(ClusterConfig(cores=2), 1, "flex", 2), 1, 2)
    team = describe(layout(ClusterConfig(cores=2), 5, "sync", 2), 5, 2)
    assert team.startswith("layout: 5 agents, 2 cores: 2 rollout worker(s) of 1 thread")
    assert "training worker of 1 thread(s)" in team and "--micro-batches" not in team


@pytest.mark.parametrize(
    ("cores", "agents", "units", "rollout", "train"),
    [
        (2, 5, 5, 2, 1),  # fanout on 2 cores: a rollout worker a core, the trainer beside
        (2, 2, 2, 2, 1),  # math-chain: solver and verifier generate side by side
        (4, 2, 2, 2, 2),  # the cores the rollout workers leave go to the trainer
        (16, 5, 5, 5, 11),  # one rollout worker per unit: a unit's model is resident on one
        (8, 5, 3, 3, 5),  # LoRA agents that share a base are one unit, one engine
    ],
)
def test_a_multi_agent_run_gets_a_rollout_worker_per_unit_and_core(
    cores: int, agents: int, units: int, rollout: int, train: int
) -> None:
    for mode in ("flex", "sync"):
        cfg = layout(ClusterConfig(cores=cores), agents, mode, 2, units)
        assert (cfg.rollout_workers, cfg.train_threads, cfg.train_workers) == (rollout, train, 1)
        assert cfg.threads is None and not cfg.colocate and cfg.scheduler is None


def test_lora_agents_on_one_base_keep_the_two_worker_cluster() -> None:
    """One unit serves every agent: a second rollout worker would hold a second copy of the
    base for no agent of its own, and the one-agent spread assumes no agent trains while
    another generates."""
    given = ClusterConfig(cores=4)
    assert layout(given, 3, "flex", 4, units=1) is given


def test_for_meg_reads_the_units_and_sizes_of_a_real_spec(tmp_path: Path, tiny_model: str) -> None:
    """`for_meg` on real MEGs: math-chain's two agents get two rollout workers; the same MEG
    with both agents LoRA on one base keeps its cluster; a hub model whose size is not on
    disk keeps it too."""
    import yaml

    from meg import load_meg
    from workloads import BUILTIN

    def spec_with(**agent: object) -> object:
        data = yaml.safe_load(BUILTIN["math-chain"].read_text())
        for a in data["agents"].values():
            a.update(model=tiny_model, **agent)
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_meg(path)

    given = ClusterConfig(cores=2)
    cluster, line = for_meg(spec_with(), given)  # type: ignore[arg-type]
    assert (cluster.rollout_workers, cluster.train_threads) == (2, 1)
    assert line is not None and line.startswith("layout: 2 agents, 2 cores")
    lora = spec_with(lora={"r": 4})
    assert for_meg(lora, given) == (given, None)  # type: ignore[arg-type]
    assert for_meg(spec_with(), ClusterConfig(cores=2, rollout_workers=1))[1] is None  # type: ignore[arg-type]


def test_a_small_one_agent_job_gets_workers_that_sample_and_back_propagate(
    tmp_path: Path, tiny_model: str
) -> None:
    """The TRL peer job (one node, a 0.5 M-parameter model, 2 micro-batches) on 2 cores:
    `rollout_gradients: auto` will be on, so its two workers are colocated, one thread each;
    with it off, or a micro-batch more than the cores, the trainer keeps every core."""
    import yaml

    from bench.peer_job import Job, meg_config
    from meg import load_meg

    def peer(**run: object) -> object:
        path = meg_config(Job(8, 4, 32, 2), tiny_model, tmp_path, backend="auto")
        data = yaml.safe_load(path.read_text())
        data["run"].update(run)
        path.write_text(yaml.safe_dump(data))
        return load_meg(path)

    given = ClusterConfig(cores=2)
    cluster, line = for_meg(peer(), given)  # type: ignore[arg-type]
    assert (cluster.colocate, cluster.rollout_workers, cluster.threads) == (True, 2, 1)
    assert cluster.train_threads is None and cluster.cores == 2
    assert line is not None and "each sampling and back-propagating a micro-batch" in line
    for run in ({"rollout_gradients": "off"}, {"micro_batches": 4, "episodes_per_step": 8}):
        cluster, line = for_meg(peer(**run), given)  # type: ignore[arg-type]
        assert not cluster.colocate and cluster.train_threads == 2, run
    bf16 = for_meg(peer(rollout_gradients="auto"), ClusterConfig(cores=2, rollout_workers=2))
    assert bf16[1] is None  # a cluster of the user's own: untouched


@pytest.mark.parametrize(
    ("env", "files", "gpus"),
    [
        ({}, [], 0),  # this machine: no GPU
        ({}, ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"], 2),  # the driver's own files
        ({"CUDA_VISIBLE_DEVICES": "1,3"}, ["nvidia0"], 2),  # the variable wins
        ({"CUDA_VISIBLE_DEVICES": ""}, ["nvidia0"], 0),  # set empty: none
        ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, [], 1),  # CUDA stops at an invalid entry
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f2b"}, [], 1),  # a UUID counts
    ],
)
def test_visible_gpus_are_counted_without_torch(
    tmp_path: Path, env: dict[str, str], files: list[str], gpus: int
) -> None:
    from flows.cluster.layout import visible_gpus

    for f in files:
        (tmp_path / f).touch()
    assert visible_gpus(env, tmp_path) == gpus


def test_a_machine_with_gpus_keeps_the_two_worker_cluster_and_says_how_to_choose(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan counts cores: on a GPU machine it would put an engine per core-sized worker
    on the first GPU, each asking for the whole rollout share. A GPU run keeps the
    two-worker cluster and its line names the way to a worker per GPU."""
    import yaml

    from meg import load_meg
    from workloads import BUILTIN

    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    for a in data["agents"].values():
        a["model"] = tiny_model
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    spec = load_meg(tmp_path / "m.yaml")
    given = ClusterConfig(cores=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cluster, line = for_meg(spec, given)
    assert cluster is given and line is not None
    assert "1 GPU(s) seen" in line and "dask_cuda.LocalCUDACluster" in line
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: the plan of the cores
    assert for_meg(spec, given)[0].rollout_workers == 2


@pytest.mark.slow
def test_train_lays_out_its_own_cluster_for_a_one_agent_job(
    tmp_path: Path, tiny_model: str, prefect_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run on the default cluster settings (its own cluster; the session's Prefect
    server, which the layout does not depend on, instead of a server started for it): the
    one-agent job of a small model gets 2 colocated workers (planned for 2 cores) that
    sample and back-propagate (`rollout_gradients: auto` → on, recorded in run.json), and
    says so; its scores are computed inside the generate tasks (`fused_scores`), on the
    generating worker right after each segment; no train task runs; its run is audited
    clean."""
    from bench.peer_job import Job, meg_config
    from flows.cli.main import main

    cfg = meg_config(Job(2, 2, 4, 2), tiny_model, tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run_dir), "--cores", "2"]) == 0
    logged = capsys.readouterr().out
    assert "layout: one agent, on-policy, 2 cores: 2 workers of 1 thread, each" in logged
    recorded = json.loads((run_dir / "run.json").read_text())
    assert recorded["spec"]["run"]["rollout_gradients"] == "on"
    assert recorded["sources"]["rollout_gradients"] == "auto"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2  # each samples and back-propagates; no training worker
    assert summary["consistency"]["violations"] == 0 and summary["steps"] == 2
    timeline = json.loads((run_dir / "timeline.json").read_text())
    gens = {(t["step"], t["micro_batch"]): t for t in timeline if t["phase"] == "generate"}
    assert len({t["worker"] for t in gens.values()}) == 2  # both rollout workers generated
    scores = [t for t in timeline if t["phase"] == "score"]
    assert len(scores) == len(gens) == 2 * 2
    for s in scores:
        gen = gens[(s["step"], s["micro_batch"])]
        assert s["worker"] == gen["worker"] and s["start"] >= gen["end"]
    phases = {t["phase"] for t in timeline}
    assert "train_micro_batch" not in phases  # the parts come back-propagated
    steps = [t for t in timeline if t["phase"] == "optimizer_step"]
    assert len(steps) == 2 and {t["worker"] for t in steps} <= {t["worker"] for t in gens.values()}
