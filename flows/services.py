"""The local background services behind `rlhf up` / `rlhf down`: Prefect server, MLflow server, deployment server.

Each service runs detached (its own session, so it outlives the `rlhf up` process and `down` can signal its whole
process group), logs to `<state>/services/<name>.log` and records its pid in `<state>/services/<name>.pid`. The
functions here never print; the CLI prints what they return.

Host and ports come from `RLHF_HOST`, `RLHF_PREFECT_PORT`, `RLHF_MLFLOW_PORT` (loopback, 4200, 5000 by default).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
SERVE_DEPLOYMENT = "rlhf/full"  # registered by `rlhf serve`; its presence (freshly polled) means serve is ready

# Startup order; `down` stops in reverse, so the deployment server goes before the Prefect server it talks to.
ORDER = ("prefect", "mlflow", "serve")

_POLL_S = 0.25
_LOG_TAIL_LINES = 20

# Requests go to our own loopback servers: bypass any HTTP(S)_PROXY from the environment, which would otherwise
# route (and usually break) them when no_proxy does not list the host.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class _Endpoints:
    """Where the services listen (bind host) and how clients on this machine reach them."""

    bind_host: str
    client_host: str
    prefect_port: int
    mlflow_port: int

    @property
    def prefect_ui(self) -> str:
        return f"http://{self.client_host}:{self.prefect_port}"

    @property
    def prefect_api(self) -> str:
        return f"{self.prefect_ui}/api"

    @property
    def mlflow_ui(self) -> str:
        return f"http://{self.client_host}:{self.mlflow_port}"


@dataclass(frozen=True)
class _Service:
    """One background service: how to start it, where it listens, and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    url: str  # the base URL reported to the user (and recorded beside the pid file)
    port: int | None  # checked for a foreign listener before starting; None for serve (no port of its own)
    ready: Callable[[Path], bool]  # receives the state dir; True once the service answers as ready


# ----------------------------------------------------------------------------------------------------------------
# configuration


def _env_port(var: str, default: int) -> int:
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{var}={port} is out of range (1-65535)")
    return port


def _endpoints() -> _Endpoints:
    host = os.environ.get("RLHF_HOST") or DEFAULT_HOST
    # A wildcard bind address is not something to connect to; this machine reaches it over loopback.
    client = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in client and not client.startswith("["):
        client = f"[{client}]"  # IPv6 literal inside a URL
    return _Endpoints(
        bind_host=host,
        client_host=client,
        prefect_port=_env_port("RLHF_PREFECT_PORT", DEFAULT_PREFECT_PORT),
        mlflow_port=_env_port("RLHF_MLFLOW_PORT", DEFAULT_MLFLOW_PORT),
    )


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


def _prefect_home(state: Path) -> str:
    return os.environ.get("PREFECT_HOME") or str(Path(state).resolve() / "prefect")


def _services(state: Path, ep: _Endpoints) -> dict[str, _Service]:
    state = Path(state).resolve()
    prefect_env = {"PREFECT_HOME": _prefect_home(state), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return {
        "prefect": _Service(
            name="prefect",
            argv=[sys.executable, "-m", "prefect", "server", "start",
                  "--host", ep.bind_host, "--port", str(ep.prefect_port)],
            env=prefect_env,
            cwd=state,
            url=ep.prefect_ui,
            port=ep.prefect_port,
            ready=lambda _s: _http_ok(f"{ep.prefect_api}/health"),
        ),
        "mlflow": _Service(
            name="mlflow",
            argv=[sys.executable, "-m", "mlflow", "server",
                  "--host", ep.bind_host, "--port", str(ep.mlflow_port), "--workers", "1",
                  "--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}",
                  "--default-artifact-root", (state / "mlartifacts").as_uri()],
            # The job-execution runner (an extra process pool) is what makes the default start take ~30 s and
            # ~1.6 GB; the pipeline does not use MLflow jobs.
            env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            # Relative defaults (./mlartifacts for proxied artifacts) land in the state dir, not the caller's cwd.
            cwd=state,
            url=ep.mlflow_ui,
            port=ep.mlflow_port,
            ready=lambda _s: _http_ok(f"{ep.mlflow_ui}/health"),
        ),
        "serve": _Service(
            name="serve",
            argv=[sys.executable, "-m", "flows.cli", "serve"],
            env={**prefect_env, "PREFECT_API_URL": ep.prefect_api, "RLHF_HOME": str(state)},
            cwd=None,  # the caller's working directory, as if `rlhf serve` were run there
            url=ep.prefect_api,
            port=None,
            ready=lambda s: _serve_ready(ep.prefect_api, _pid_started_at(s, "serve")),
        ),
    }


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


def _serve_ready(prefect_api: str, started_at: float | None) -> bool:
    """The `rlhf/full` deployment exists and was polled by a runner since the serve process started.

    The deployment row outlives the serve process in Prefect's database, so its mere existence would report a
    restarted (or crashed) serve as ready at once; `last_polled` is refreshed by the live runner.
    """
    got = _http_get(f"{prefect_api}/deployments/name/{SERVE_DEPLOYMENT}")
    if got is None or got[0] != 200:
        return False
    try:
        body = json.loads(got[1])
    except ValueError:
        return True  # 200 without a readable body: accept the contract's minimum
    if not isinstance(body, dict) or "last_polled" not in body or started_at is None:
        return True
    polled = body["last_polled"]
    if not polled:
        return False
    try:
        polled_at = datetime.fromisoformat(str(polled).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return polled_at >= started_at - 2.0  # slack for the pid file being written just after the spawn


def _port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=1.0):
            return True
    except OSError:
        return False


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


def _live_pid(state: Path, name: str) -> int | None:
    """The pid recorded for `name` when that process is still running and is ours, else None."""
    pid = _read_pid(state, name)
    if pid is None or not _pid_alive(pid) or not _is_ours(pid, name):
        return None
    return pid


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


def up(state: Path, with_serve: bool = True, timeout_s: float = 90) -> dict[str, str]:
    """Start the Prefect server, the MLflow server and (if `with_serve`) the deployment server in the background.

    A service whose pid file names a live process is not started again (only waited for until it is healthy); a
    stale pid file is removed. Fails with RuntimeError, naming the URL, when a port is already taken by something
    that is not our service, or when a service exits or is not ready within `timeout_s`.
    Returns {"prefect_ui", "prefect_api", "mlflow_ui"} URLs.
    """
    state = Path(state).resolve()
    ep = _endpoints()
    specs = _services(state, ep)
    names = [n for n in ORDER if with_serve or n != "serve"]

    running: dict[str, int] = {}
    for name in names:
        pid = _live_pid(state, name)
        if pid is None:
            _forget(state, name)  # stale or absent
            continue
        running[name] = pid
        recorded = _recorded_url(state, name, specs[name].url)
        if recorded != specs[name].url:
            # Probing the new URL would time out; the running copy keeps its address until restarted.
            raise RuntimeError(
                f"{name} is already running at {recorded} (pid {pid}), not at {specs[name].url} as now "
                "configured; run `rlhf down` first to change host or ports."
            )

    # Check every port before starting anything, so a conflict leaves nothing half-started.
    for name in names:
        svc = specs[name]
        if name not in running and svc.port is not None and _port_open(ep.client_host, svc.port):
            raise RuntimeError(
                f"cannot start {name}: {svc.url} is already in use by another process (not one started by "
                f"`rlhf up` for {state}). Stop it, or choose another port with "
                f"RLHF_{name.upper()}_PORT."
            )

    started: dict[str, int] = {}
    try:
        # The two servers are independent: start both, then wait, so their start-up times overlap.
        for name in ("prefect", "mlflow"):
            if name not in running:
                started[name] = _spawn(state, specs[name])
        for name in ("prefect", "mlflow"):
            _wait_ready(state, specs[name], running.get(name) or started[name], timeout_s)
        if with_serve:  # after the Prefect server: serve registers its deployments through its API
            if "serve" not in running:
                started["serve"] = _spawn(state, specs["serve"])
            _wait_ready(state, specs["serve"], running.get("serve") or started["serve"], timeout_s)
    except BaseException:
        # All or nothing: what this call started goes again (serve first), so a failed `up` leaves no
        # half-started set behind; services that were already running are left as they were.
        for name in reversed(ORDER):
            if name in started:
                _stop_pid(started[name], timeout_s=5.0)
                _forget(state, name)
        raise

    return urls(state)


def down(state: Path, timeout_s: float = 20) -> list[str]:
    """Stop the services `up` started (serve first, then MLflow, then Prefect); returns the names stopped.

    SIGTERM to each process group, SIGKILL after `timeout_s`; pid files are removed. Nothing running: [].
    """
    state = Path(state).resolve()
    stopped: list[str] = []
    for name in reversed(ORDER):
        pid = _live_pid(state, name)
        if pid is not None:
            _stop_pid(pid, timeout_s)
            stopped.append(name)
        _forget(state, name)
    return stopped


# ----------------------------------------------------------------------------------------------------------------
# inspection


def _recorded_url(state: Path, name: str, default: str) -> str:
    """The URL the service was started at (it may differ from the current env's), else `default`."""
    try:
        return _url_file(state, name).read_text().strip() or default
    except OSError:
        return default


def urls(state: Path) -> dict[str, str]:
    """{"prefect_ui", "prefect_api", "mlflow_ui"}: where the services run (as recorded by `up`, else per env)."""
    ep = _endpoints()
    prefect_ui = _recorded_url(state, "prefect", ep.prefect_ui)
    return {
        "prefect_ui": prefect_ui,
        "prefect_api": f"{prefect_ui}/api",
        "mlflow_ui": _recorded_url(state, "mlflow", ep.mlflow_ui),
    }


def status(state: Path) -> dict[str, dict]:
    """Per service: {"pid": int | None, "alive": bool, "url": str, "healthy": bool, "log": str}."""
    state = Path(state).resolve()
    u = urls(state)
    checks: dict[str, tuple[str, Callable[[], bool]]] = {
        "prefect": (u["prefect_ui"], lambda: _http_ok(f"{u['prefect_api']}/health")),
        "mlflow": (u["mlflow_ui"], lambda: _http_ok(f"{u['mlflow_ui']}/health")),
        "serve": (u["prefect_api"], lambda: _serve_ready(u["prefect_api"], _pid_started_at(state, "serve"))),
    }
    out: dict[str, dict] = {}
    for name in ORDER:
        url, healthy = checks[name]
        pid = _read_pid(state, name)
        alive = pid is not None and _pid_alive(pid) and _is_ours(pid, name)
        out[name] = {
            "pid": pid,
            "alive": alive,
            "url": url,
            "healthy": alive and healthy(),  # a foreign server on the port is not our service being healthy
            "log": str(log_file(state, name)),
        }
    return out


def running_prefect_api(state: Path) -> str | None:
    """The API URL of the Prefect server `rlhf up` started, when it is alive and healthy; else None."""
    state = Path(state).resolve()
    if _live_pid(state, "prefect") is None:
        return None
    api = urls(state)["prefect_api"]
    return api if _http_ok(f"{api}/health") else None
