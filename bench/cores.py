"""How many of the machine's cores were busy over a window: the bound a schedule works under.

A schedule can only be faster than another on the same machine by using more of its cores or
doing less work. `CoreSampler` reads the machine-wide CPU times (`psutil.cpu_times`, i.e.
/proc/stat: every process, the workers and the driver alike) every `period` seconds in a
thread of the benchmark's process; `busy(begin, end)` is the CPU-seconds spent between the
first and last sample inside [begin, end] over that interval, in cores (2.0: both of two
cores busy). With a run's step time it gives the run's work a step in core-seconds
(`busy × step_s`), and so the fastest step any schedule doing that work could reach on this
machine: work / cores.
"""

from __future__ import annotations

import bisect
import threading
import time
from types import TracebackType

import psutil


def cpu_busy_seconds() -> float:
    """Machine-wide CPU-seconds spent on anything but idle and I/O wait, since boot."""
    t = psutil.cpu_times()
    return float(sum(getattr(t, f) for f in ("user", "nice", "system", "irq", "softirq")))


class CoreSampler:
    """Samples `cpu_busy_seconds()` with its wall time (`time.time()`, the clock of a run's
    timeline) while in its `with` block."""

    def __init__(self, period: float = 0.05) -> None:
        self.period = period
        self.times: list[float] = []
        self.busy_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="core-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.times.append(time.time())
            self.busy_s.append(cpu_busy_seconds())
            self._stop.wait(self.period)

    def __enter__(self) -> CoreSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, begin: float, end: float) -> float | None:
        """Mean busy cores over [begin, end] (None: fewer than two samples inside it)."""
        lo = bisect.bisect_left(self.times, begin)
        hi = bisect.bisect_right(self.times, end) - 1
        if hi - lo < 1:
            return None
        return (self.busy_s[hi] - self.busy_s[lo]) / (self.times[hi] - self.times[lo])
