"""A process's peak resident memory, measured two ways: the kernel's high-water mark
(reset first where Linux allows it), or a 1 kHz sampling thread where it does not
(`bench.training`'s logprob-memory comparison uses both)."""

from __future__ import annotations

import resource
import sys
import threading
from pathlib import Path

import psutil


def rss_bytes() -> int:
    """The process's resident set size now."""
    return int(psutil.Process().memory_info().rss)


def maxrss_bytes() -> int:
    """The process's RSS high-water mark: `VmHWM` where /proc has it (the counter that
    clear_refs resets), else `ru_maxrss`. On Linux `ru_maxrss` also folds in the peak
    recorded when a thread exits, which clear_refs does not reset: after torch's import it
    can stay above any later peak (seen in CI: a delta of 0)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux ≥ 4.0); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class RssSampler:
    """Highest resident set size seen by a 1 kHz sampling thread.

    The fallback where the kernel's high-water mark cannot be reset (containers and
    sandboxes refuse writes to /proc/self/clear_refs): without a reset, the high-water mark still
    holds the import-time peak, and the measured delta is 0. The logits of one micro-batch
    live through the whole backward pass, far longer than the sampling period.
    """

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
