"""Process helpers of the tests that start `rlhf` subprocesses."""

from __future__ import annotations


def kill_all(processes) -> None:
    """Kill each of `processes` (Popen or psutil.Process) that is still alive, ignoring those already gone."""
    import psutil

    for p in processes:
        try:
            p.kill()
        except (OSError, psutil.Error):
            pass
