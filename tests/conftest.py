"""Session-wide real components shared by several test folders."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


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
