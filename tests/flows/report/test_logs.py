"""The orchestrator's decisions reach the flow run's log: a real Prefect server, read back
through its API."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from uuid import UUID

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
from prefect.logging.handlers import APILogHandler
from prefect.runtime import flow_run

from flows.report.logs import DRIVER, orchestrator_logs

BALANCER = logging.getLogger(f"{DRIVER}.placement")


def run_logs(run_id: str | None = None, since: datetime | None = None) -> list[tuple[int, str]]:
    """Log lines as the API holds them (after sending what is queued): one flow run's, or
    every run's since a time."""
    APILogHandler().flush()
    flt = LogFilter(
        flow_run_id=LogFilterFlowRunId(any_=[UUID(run_id)]) if run_id else None,
        timestamp=LogFilterTimestamp(after_=since) if since else None,
    )

    async def read() -> list[tuple[int, str]]:
        async with get_client() as client:
            return [(log.level, log.message) for log in await client.read_logs(log_filter=flt)]

    return asyncio.run(read())


@flow(name="logs-under-test")
def decide() -> tuple[bool, str]:
    with orchestrator_logs() as routed:
        BALANCER.info("rollout balancer after step %d: engines per agent a 2, b 1", 3)
        BALANCER.debug("not shown: below INFO")
        BALANCER.warning("a warning of the driver")
    BALANCER.info("after the pipeline: not routed")
    return routed, str(flow_run.id)


def test_driver_lines_reach_the_flow_runs_log_once(prefect_server: str) -> None:
    routed, run_id = decide()
    assert routed
    logs = run_logs(run_id)
    messages = [m for _, m in logs]
    assert messages.count("rollout balancer after step 3: engines per agent a 2, b 1") == 1
    assert (logging.WARNING, "a warning of the driver") in logs
    assert not any("not shown" in m or "not routed" in m for m in messages)
    # the logger is as it was: no handler left, propagating, its level untouched
    driver = logging.getLogger(DRIVER)
    assert (driver.handlers, driver.propagate, driver.level) == ([], True, logging.NOTSET)


def test_outside_a_flow_run_nothing_changes() -> None:
    with orchestrator_logs() as routed:
        assert not routed
        assert logging.getLogger(DRIVER).handlers == []
