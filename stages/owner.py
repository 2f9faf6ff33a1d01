"""The process that owns an MLflow run: host, pid and the pid's start time, as tags on every run the pipeline opens,
so that the next run on this machine can tell a killed owner from a live one (`stages.reaper`)."""

from __future__ import annotations

import os
import socket

import psutil

HOST, PID, STARTED = "rlhf.owner.host", "rlhf.owner.pid", "rlhf.owner.started"


def _started(pid: int) -> str | None:
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def owner_tags() -> dict[str, str]:
    """This process as the owner of a run: host name, pid, and the pid's start time (pids are reused)."""
    return {HOST: socket.gethostname(), PID: str(os.getpid()), STARTED: _started(os.getpid()) or ""}


def owner_alive(tags: dict[str, str]) -> bool:
    """Whether the process of a run's owner tags (on this host) still runs. Runs without the tags count as alive."""
    try:
        pid = int(tags[PID])
    except (KeyError, ValueError):
        return True
    started = _started(pid)
    return started is not None and (not tags.get(STARTED) or started == tags[STARTED])
