"""Background processes of the local services: a `Service` (how to start one, where it listens, when it is ready),
its pid, url and log files under `<state>/services/`, and starting, probing and stopping it with psutil.

A pid file holds the pid and the process's start time, so a pid the OS has since given to another process is never
taken for the service. Nothing here knows which services exist (that is `services.servers`); nothing here prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

POLL_S = 0.25
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class Service:
    """One background service: how to start it, where it listens, and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    url: str  # the base URL reported to the user (and recorded beside the pid file)
    port: int | None  # checked for a foreign listener before starting; None for serve (no port of its own)
    ready: Callable[[Path], bool]  # receives the state dir; True once the service answers as ready
    unset: tuple[str, ...] = ()  # inherited variables the service must not see


def child_env(svc: Service, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment `svc` starts with: `base` (this process's) without `svc.unset`, then `svc.env` over it."""
    inherited = os.environ if base is None else base
    return {**{k: v for k, v in inherited.items() if k not in svc.unset}, **svc.env}


def services_dir(state: Path) -> Path:
    """`<state>/services/`: the log, pid and url files of the background services."""
    return Path(state) / "services"


def log_file(state: Path, name: str) -> Path:
    return services_dir(state) / f"{name}.log"


def _pid_file(state: Path, name: str) -> Path:
    return services_dir(state) / f"{name}.pid"


def _url_file(state: Path, name: str) -> Path:
    return services_dir(state) / f"{name}.url"


def read_pid(state: Path, name: str) -> tuple[int, float | None] | None:
    """(pid, start time) recorded for `name`; None without a readable pid file."""
    try:
        fields = _pid_file(state, name).read_text().split()
        return int(fields[0]), float(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None


def started_at(state: Path, name: str) -> float | None:
    """When the recorded process started (seconds since the epoch), from its pid file."""
    got = read_pid(state, name)
    return got[1] if got else None


def recorded_url(state: Path, name: str, default: str) -> str:
    """The URL the service was started at (it may differ from the current env's), else `default`."""
    try:
        return _url_file(state, name).read_text().strip() or default
    except OSError:
        return default


def forget(state: Path, name: str) -> None:
    for f in (_pid_file(state, name), _url_file(state, name)):
        f.unlink(missing_ok=True)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def alive(pid: int, created: float | None = None) -> bool:
    """Whether process `pid` runs (not a zombie) and, given its recorded start time, is still that process."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            proc.wait(0)  # our own exited child (`up` and `down` in one process): collect it
            return False
        return created is None or abs(proc.create_time() - created) < 1.0
    except (psutil.NoSuchProcess, psutil.TimeoutExpired, ChildProcessError):
        return False
    except psutil.AccessDenied:
        return True  # exists, owned by someone else


def live_pid(state: Path, name: str) -> int | None:
    """The pid recorded for `name` when that very process is still running, else None."""
    got = read_pid(state, name)
    return got[0] if got and alive(*got) else None


def spawn(state: Path, svc: Service) -> int:
    """Start `svc` detached (its own session: it outlives `rlhf up`, and `stop` can signal all of it), output to
    its log file; records and returns its pid."""
    services_dir(state).mkdir(parents=True, exist_ok=True)
    if svc.cwd is not None:
        svc.cwd.mkdir(parents=True, exist_ok=True)
    if "PREFECT_HOME" in svc.env:
        Path(svc.env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect does not create its parents
    with open(log_file(state, svc.name), "wb") as log:  # truncated: the tail on failure is this attempt's
        proc = subprocess.Popen(svc.argv, env=child_env(svc), cwd=svc.cwd, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    _pid_file(state, svc.name).write_text(f"{proc.pid} {psutil.Process(proc.pid).create_time()}\n")
    _url_file(state, svc.name).write_text(f"{svc.url}\n")
    return proc.pid


def stop(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group `pid` leads (the service and its workers), SIGKILL what outlives `timeout_s`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # not a group leader we may signal: each process we know of
            for p in procs:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
        _, procs = psutil.wait_procs(procs, timeout=wait_s)
        if not procs:
            return


def wait_ready(state: Path, svc: Service, pid: int, timeout_s: float) -> None:
    """Poll until `svc` is ready; raise RuntimeError with its log's tail if it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not svc.ready(state):
        exited = not alive(pid)
        if exited or time.monotonic() >= deadline:
            if exited:
                forget(state, svc.name)
            what = "exited during start-up" if exited else f"was not ready within {timeout_s:.0f} s"
            log = log_file(state, svc.name)
            raise RuntimeError(f"{svc.name} service ({svc.url}) {what}. Last lines of {log}:\n{log_tail(log)}")
        time.sleep(POLL_S)
