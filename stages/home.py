"""The state dir (`$RLHF_HOME`, else `.rlhf/` under the working directory) and the lock files under it."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


def state_dir() -> Path:
    """`$RLHF_HOME`, else `.rlhf/` under the working directory."""
    return Path(os.environ.get("RLHF_HOME") or Path.cwd() / ".rlhf").resolve()


@contextmanager
def file_lock(name: str):
    """An exclusive lock file under `<state>/locks/`: processes on this machine sharing the state dir take turns."""
    locks = state_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
