"""Session-wide real components shared by several test folders."""

from __future__ import annotations

import os
import resource
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with end-to-end (`slow`) tests first, the most of them first; order kept
    within a file. pytest-xdist hands whole files to its workers in this order
    (`--dist loadfile`), so the long files start at once and the short ones fill the gaps:
    longest-first packing, which keeps the suite's wall time near its work / 2."""
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


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Each test's CPU seconds, setup and teardown included, ride on its teardown report (to
    the xdist controller too). On 2 cores the suite is CPU-bound: its wall time follows its
    CPU. A session fixture's processes count where they end (the last test of a worker)."""
    if call.when == "teardown" and _START in item.stash:
        item.user_properties.append((CPU, round(_cpu() - item.stash[_START], 2)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        cpu = dict(report.user_properties).get(CPU)
        if cpu is not None:
            _CPU_BY_TEST[report.nodeid] = float(cpu)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The 30 tests that used the most CPU, beside pytest's 30 slowest."""
    if not _CPU_BY_TEST:
        return
    total = sum(_CPU_BY_TEST.values())
    top = min(30, len(_CPU_BY_TEST))
    terminalreporter.section(f"most CPU: {top} of {len(_CPU_BY_TEST)} tests ({total:.0f} s in all)")
    for nodeid, cpu in sorted(_CPU_BY_TEST.items(), key=lambda x: -x[1])[:30]:
        terminalreporter.write_line(f"{cpu:8.1f}s cpu  {nodeid}")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        os.environ["PREFECT_API_URL"] = url  # the Dask workers inherit it
        yield url
        os.environ.pop("PREFECT_API_URL", None)
