"""The orchestrator's decisions in the flow run's log.

The driver's policies say what they decided with `logging` at INFO: the rollout balancer's
new split, an elastic move of an agent's training, the bandit's and SERA's choices. Python's
root logger stops INFO, and Prefect gives its handlers to its own loggers only, so those
lines reached neither the terminal nor the Prefect UI. While a run's pipeline runs, this
hands the records of `flows.orchestrator` (INFO and up) to the flow run's logger, console
and UI like the run's other lines, and nowhere else, so nothing prints twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

DRIVER = "flows.orchestrator"  # the package whose decisions a user should see


class _ToRunLogger(logging.Handler):
    def __init__(self, run_logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        super().__init__(logging.INFO)
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        self.run_logger.log(record.levelno, record.getMessage())


@contextmanager
def orchestrator_logs(name: str = DRIVER) -> Iterator[bool]:
    """Route `name`'s lines to the current flow run's logger while inside (not also to the
    root logger's console); yields False, and changes nothing, outside a flow run."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        run_logger = get_run_logger()
    except MissingContextError:
        yield False
        return
    logger = logging.getLogger(name)
    handler, level, propagate = _ToRunLogger(run_logger), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
