"""Low-level helpers behind `flows.services`: pid/url files, detached processes, liveness and HTTP/port probes.

Each service records its pid in `<state>/services/<name>.pid` and the URL it was started at in
`<state>/services/<name>.url`, and logs to `<state>/services/<name>.log`. Nothing here knows how a service is
started or configured (that is `flows.services`); the functions here never print.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: flows.services imports this module
    from flows.services import _Service

_POLL_S = 0.25
_LOG_TAIL_LINES = 20

# Requests go to our own loopback servers: bypass any HTTP(S)_PROXY from the environment, which would otherwise
# route (and usually break) them when no_proxy does not list the host.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ----------------------------------------------------------------------------------------------------------------
# files


def services_dir(state: Path) -> Path:
    """`<state>/services/`: the log, pid and url files of the background services."""
    return Path(state) / "services"


def _pid_file(state: Path, name: str) -> Path:
    return services_dir(state) / f"{name}.pid"


def _url_file(state: Path, name: str) -> Path:
    return services_dir(state) / f"{name}.url"


def log_file(state: Path, name: str) -> Path:
    """The log file of service `name` (`prefect`, `mlflow` or `serve`)."""
    return services_dir(state) / f"{name}.log"


def _read_pid(state: Path, name: str) -> int | None:
    try:
        return int(_pid_file(state, name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pid_started_at(state: Path, name: str) -> float | None:
    try:
        return _pid_file(state, name).stat().st_mtime
    except OSError:
        return None


def _recorded_url(state: Path, name: str, default: str) -> str:
    """The URL the service was started at (it may differ from the current env's), else `default`."""
    try:
        return _url_file(state, name).read_text().strip() or default
    except OSError:
        return default


def _forget(state: Path, name: str) -> None:
    for f in (_pid_file(state, name), _url_file(state, name)):
        f.unlink(missing_ok=True)


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


# ----------------------------------------------------------------------------------------------------------------
# probes


def _http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET, or None when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _http_ok(url: str) -> bool:
    got = _http_get(url)
    return got is not None and got[0] == 200


def _port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=1.0):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------------------------
# liveness and ownership


def _reap(pid: int) -> bool:
    """Collect `pid` if it is our exited child (when `up` and `down` run in one process); True if it was reaped."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    if _reap(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        # Linux: a zombie still answers kill(0); its state letter follows the parenthesised command name.
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_CMDLINE_MARKERS = {"prefect": "prefect", "mlflow": "mlflow", "serve": "flows.cli"}


def _is_ours(pid: int, name: str) -> bool:
    """Guard against pid reuse: the process's command line still names the service (where /proc tells)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc (macOS): trust the pid file
    return _CMDLINE_MARKERS[name] in cmdline


def _live_pid(state: Path, name: str) -> int | None:
    """The pid recorded for `name` when that process is still running and is ours, else None."""
    pid = _read_pid(state, name)
    if pid is None or not _pid_alive(pid) or not _is_ours(pid, name):
        return None
    return pid


# ----------------------------------------------------------------------------------------------------------------
# start / stop


def _spawn(state: Path, svc: _Service) -> int:
    """Start `svc` detached, output to its log file; records and returns its pid."""
    sdir = services_dir(state)
    sdir.mkdir(parents=True, exist_ok=True)
    if svc.cwd is not None:
        svc.cwd.mkdir(parents=True, exist_ok=True)
    if "PREFECT_HOME" in svc.env:
        Path(svc.env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect does not create its parents
    env = {**os.environ, **svc.env}
    with open(log_file(state, svc.name), "wb") as log:  # truncated: the tail on failure is this attempt's
        proc = subprocess.Popen(
            svc.argv,
            env=env,
            cwd=svc.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: survives our exit, and `down` can signal all of it
            close_fds=True,
        )
    _pid_file(state, svc.name).write_text(f"{proc.pid}\n")
    _url_file(state, svc.name).write_text(f"{svc.url}\n")
    return proc.pid


def _stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group `pid` leads, then SIGKILL it if it outlives `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)  # not a group leader we may signal: at least the process itself
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.1)


def _wait_ready(state: Path, svc: _Service, pid: int, timeout_s: float) -> None:
    """Poll until `svc` is ready; raise RuntimeError with its log's tail if it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if svc.ready(state):
            return
        exited = not _pid_alive(pid)
        if exited or time.monotonic() >= deadline:
            if exited:
                _forget(state, svc.name)
            what = "exited during start-up" if exited else f"was not ready within {timeout_s:.0f} s"
            log = log_file(state, svc.name)
            raise RuntimeError(
                f"{svc.name} service ({svc.url}) {what}. Last lines of {log}:\n{_log_tail(log)}"
            )
        time.sleep(_POLL_S)
