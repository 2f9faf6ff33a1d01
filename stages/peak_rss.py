"""The peak resident memory of this process while a stage builds, sampled by a thread (the kernel's `ru_maxrss` is
the peak of the process's whole life, which in `rlhf run full` covers every earlier stage). Logged on the stage's
MLflow run as `system/peak_rss_gb`, so that `rlhf plan`'s estimate can be checked against it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import ctypes
import gc
import threading

import psutil


def release_freed_memory() -> None:
    """Give memory that earlier stages freed back to the OS: a collection, then glibc's `malloc_trim(0)` (freed
    blocks otherwise stay in the process's heap, so `rlhf run full` would carry SFT's peak into the reward stage's
    RSS). A no-op where there is no glibc."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """`with PeakRSS() as peak: ...`, then `peak.bytes`: the largest RSS seen, every `interval_s` seconds, from the
    start (the RSS on entry included)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.bytes = 0
        self.start = 0  # the RSS on entry
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def _read(self) -> None:
        self.bytes = max(self.bytes, self._proc.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> PeakRSS:
        self._read()
        self.start = self.bytes
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
