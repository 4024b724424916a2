"""Session-wide real components shared by several test folders (a Prefect server, a Dask
cluster, the long-tail model), and the suite's order and CPU report."""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CPU = "cpu_s"  # a teardown report's user property: the test's CPU seconds
_CPU_BY_TEST: dict[str, float] = {}


def _cpu() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_START = pytest.StashKey[float]()
_TEARDOWN = pytest.StashKey[float]()  # CPU seconds when the last test's teardown began
SESSION_END = "(session fixtures torn down after {})"


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's `--dist loadfile` reorders the files by their number of tests
    (`--loadscope-reorder`, on by default), which undid the order below: files of many quick
    tests went first and a long end-to-end file could start last, alone on one worker.
    Off unless asked for on the command line."""
    asked = "--loadscope-reorder" in config.invocation_params.args
    if hasattr(config.option, "loadscopereorder") and not asked:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with end-to-end (`slow`) tests first, the most of them first; order kept
    within a file. pytest-xdist hands whole files to its workers in this order
    (`--dist loadfile`, its reordering switched off in `pytest_configure`), so the long
    files start at once and the short ones fill the gaps: longest-first packing, which
    keeps the suite's wall time near its work / 2."""
    slow: dict[str, int] = {}
    for item in items:
        slow.setdefault(item.nodeid.split("::")[0], 0)
        if item.get_closest_marker("slow"):
            slow[item.nodeid.split("::")[0]] += 1
    rank = {f: i for i, f in enumerate(sorted(slow, key=lambda f: -slow[f]))}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    item.stash[_START] = _cpu()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:  # the session's fixtures end in this teardown
        item.stash[_TEARDOWN] = _cpu()
    yield


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Each test's CPU seconds, setup and teardown included, ride on its teardown report (to
    the xdist controller too). On 2 cores the suite is CPU-bound: its wall time follows its
    CPU. A module fixture's processes count where they end (its file's last test); the
    session fixtures' (Prefect server, Dask cluster: their whole life's CPU, counted when
    they exit) on a line of their own, not on the last test of the worker."""
    if call.when == "teardown" and _START in item.stash:
        now = _cpu()
        began = item.stash.get(_TEARDOWN, now)
        item.user_properties.append((CPU, round(began - item.stash[_START], 2)))
        if _TEARDOWN in item.stash:
            item.user_properties.append((SESSION_END, round(now - began, 2)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        props: dict[str, Any] = dict(report.user_properties)
        if props.get(CPU) is not None:
            _CPU_BY_TEST[report.nodeid] = float(props[CPU])
        if props.get(SESSION_END) is not None:
            _CPU_BY_TEST[SESSION_END.format(report.nodeid)] = float(props[SESSION_END])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The 30 tests that used the most CPU, beside pytest's 30 slowest."""
    if not _CPU_BY_TEST:
        return
    total = sum(_CPU_BY_TEST.values())
    top = min(30, len(_CPU_BY_TEST))
    terminalreporter.section(f"most CPU: {top} of {len(_CPU_BY_TEST)} tests ({total:.0f} s in all)")
    for nodeid, cpu in sorted(_CPU_BY_TEST.items(), key=lambda x: -x[1])[:30]:
        terminalreporter.write_line(f"{cpu:8.1f}s cpu  {nodeid}")


# A run's pictures (reward_curve.png, timeline.png and their Prefect artifacts) are drawn only
# in the test files that read them; every other run of the suite skips them
# (`flows.report.artifacts.PLOTS_ENV`): 0.3-0.5 s of the driver's CPU a run, over the
# suite's ~150 runs, plus matplotlib's import in each `flexmarl` process. A test
# elsewhere that reads a run's pictures belongs in this list. The variable reaches the
# `flexmarl` commands the tests start, and a value set outside the suite is kept.
PLOTS_ENV = "FLEXMARL_PLOTS"
DRAWS_PLOTS = (
    "tests/flows/test_train.py",  # the PNG files and the artifacts of a run
    "tests/flows/test_ui.py",  # the artifacts, rendered by the Prefect UI
    "tests/bench/test_e2e_bench.py",  # the benchmark's copies of the timelines
)
os.environ.setdefault(PLOTS_ENV, "0")


@pytest.fixture(autouse=True)
def _plots_where_read(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.nodeid.split("::")[0] in DRAWS_PLOTS:
        monkeypatch.setenv(PLOTS_ENV, "1")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """The session's Prefect API server. The flows this process runs send no heartbeats:
    Prefect's heartbeat thread sleeps in 1 s ticks and each flow's exit joins it, so every
    run (the `train` flow and its pipeline subflow) waited ~1.2 s for nothing, measured over
    warm runs on the session cluster (4.6 s a run with heartbeats, 3.4 s without). No test
    here reads heartbeats (they mark crashed flow runs of deployments); the `flexmarl`
    commands the tests start as processes keep Prefect's default."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        os.environ["PREFECT_API_URL"] = url  # the Dask workers inherit it
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield url
        os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(scope="session")
def cluster(prefect_server: str) -> Iterator[str]:
    """Scheduler address of a local cluster started exactly as `flexmarl train` starts one
    (1 rollout + 1 training worker). One per test process, shared by the flows tests and the
    benchmarks' shared-cluster arms, run after run as on any long-lived cluster (each run has
    its own store; hosts are keyed by run): a second cluster per process cost its start and
    its engines' warm-up again."""
    from flows.cluster.start import ClusterConfig, dask_cluster

    with dask_cluster(ClusterConfig()) as workers:
        yield workers.address


LONGTAIL_WARM_STEPS = 30


@pytest.fixture(scope="session")
def longtail_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny model warm-started `LONGTAIL_WARM_STEPS` steps on the long-tail format: it ends
    its lists at varied lengths (the seed-0 tiny model almost never ends a response, so
    nothing is cut or drafted), what the policy runs and the engine benchmarks need.

    Built once per `pytest` run (a minute of CPU): under xdist the first worker that needs it
    builds it in the folder above the workers' own temporary folders, under a file lock,
    while the other waits and then reads the same files (never written to). A build cut
    short leaves only its `.part-PID` folder: the model is renamed into place whole."""
    from filelock import FileLock

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
            part.rename(done)
    return str(done / "model-longtail")
