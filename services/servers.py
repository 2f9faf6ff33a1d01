"""The local background services behind `rlhf up` / `rlhf down`: Prefect server, MLflow server, deployment server.

Each service runs detached (its own session, so it outlives the `rlhf up` process and `down` can signal its whole
process group), logs to `<state>/services/<name>.log` and records its pid in `<state>/services/<name>.pid`. The
functions here never print; the CLI prints what they return. Starting, probing and stopping a process is
`services.procs`; the HTTP and port probes are `stages.net`.

Host and ports come from `RLHF_HOST`, `RLHF_PREFECT_PORT`, `RLHF_MLFLOW_PORT` (loopback, 4200, 5000 by default).
With `stores="postgres"` PostgreSQL and an S3 server start first, and the two servers use them (`services.stores`).

Over 300 lines because the table of the services (argv, environment, readiness probe) and the up / down /
status that walk it must agree on every field; they are kept in one file so that they change together.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from services import stores as shared_stores
from services.prefect_tuning import server_batching
from services.procs import (
    Service,
    forget,
    live_pid,
    log_file,
    read_pid,
    recorded_url,
    spawn,
    started_at,
    stop,
    wait_ready,
)
from stages.net import healthy, http_get, port_open

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
SERVE_DEPLOYMENT = "rlhf/full"  # registered by `rlhf serve`; its presence (freshly polled) means serve is ready

# Startup order, in phases whose services start together; `down` stops in reverse, so the deployment server goes
# before the Prefect server it talks to, and the stores go last.
PHASES = (shared_stores.NAMES, ("prefect", "mlflow"), ("serve",))
ORDER = tuple(name for phase in PHASES for name in phase)
# The hub's offline switches, and the variable in which the Makefile names those it set itself (for `make demo`).
HUB_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
MAKE_OFFLINE_MARKER = "RLHF_OFFLINE_FROM_MAKE"


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


def _prefect_home(state: Path) -> str:
    return os.environ.get("PREFECT_HOME") or str(Path(state).resolve() / "prefect")


def inherited_offline(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The variables the services must not inherit: the hub switches the Makefile set for `make demo` (named in
    `RLHF_OFFLINE_FROM_MAKE`), and the marker. The services outlive the demo and serve hub runs too, which the switch
    would make fail; one the user set is not named, and stays."""
    if MAKE_OFFLINE_MARKER not in environ:
        return ()
    named = environ[MAKE_OFFLINE_MARKER].split()
    return (*[v for v in HUB_OFFLINE if v in named], MAKE_OFFLINE_MARKER)


def _services(state: Path, ep: _Endpoints, preset: str = "demo") -> dict[str, Service]:
    state = Path(state).resolve()
    unset = inherited_offline(os.environ)
    # PREFECT_UI_API_URL: `prefect server start --port N` alone tells its UI the API is on the default port 4200.
    # CORS for its own UI only (Prefect's default is any origin: any web page a user opens could post flow runs).
    prefect_env = {**server_batching(), "PREFECT_HOME": _prefect_home(state),
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": ep.prefect_api,
                   "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": ep.prefect_ui.rstrip("/"), "PREFECT__SERVER_FINAL": "1",
                   "RLHF_BIND_HOST": ep.bind_host}
    return {
        "prefect": Service(
            name="prefect",
            # Prefect's app behind a Host check (`services.prefect_server`: DNS rebinding), as `prefect server start`
            # runs it.
            argv=[sys.executable, "-m", "uvicorn", "--factory", "services.prefect_server:create_app",
                  "--host", ep.bind_host, "--port", str(ep.prefect_port), "--lifespan", "on",
                  "--timeout-keep-alive", "5", "--log-level", "warning"],
            env=prefect_env,
            cwd=state,
            url=ep.prefect_ui,
            port=ep.prefect_port,
            ready=lambda _s: healthy(f"{ep.prefect_api}/health"),
            unset=unset,
        ),
        "mlflow": Service(
            name="mlflow",
            argv=[sys.executable, "-m", "mlflow", "server",
                  "--host", ep.bind_host, "--port", str(ep.mlflow_port), "--workers", "1",
                  "--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}",
                  "--default-artifact-root", (state / "mlartifacts").as_uri()],
            # The job-execution runner (an extra process pool) is what makes the default start slow and large; the
            # pipeline does not use MLflow jobs.
            env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            # Relative defaults (./mlartifacts for proxied artifacts) land in the state dir, not the caller's cwd.
            cwd=state,
            url=ep.mlflow_ui,
            port=ep.mlflow_port,
            ready=lambda _s: healthy(f"{ep.mlflow_ui}/health"),
            unset=unset,
        ),
        "serve": Service(
            name="serve",
            argv=[sys.executable, "-m", "cli.main", "serve", "--preset", preset],
            env={**prefect_env, "PREFECT_API_URL": ep.prefect_api, "RLHF_HOME": str(state)},
            cwd=None,  # the caller's working directory, as if `rlhf serve` were run there
            url=ep.prefect_api,
            port=None,
            ready=lambda s: _serve_ready(ep.prefect_api, started_at(s, "serve")),
            unset=unset,
        ),
    }


# ----------------------------------------------------------------------------------------------------------------
# probes


def _serve_ready(prefect_api: str, started_at: float | None) -> bool:
    """The `rlhf/full` deployment exists and was polled by a runner since the serve process started.

    The deployment row outlives the serve process in Prefect's database, so its mere existence would report a
    restarted (or crashed) serve as ready at once; `last_polled` is refreshed by the live runner.
    """
    got = http_get(f"{prefect_api}/deployments/name/{SERVE_DEPLOYMENT}")
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


# ----------------------------------------------------------------------------------------------------------------
# start / stop


def up(state: Path, with_serve: bool = True, timeout_s: float = 90, preset: str = "demo",
       stores: str = "local") -> dict[str, str]:
    """Start the Prefect server, the MLflow server and (if `with_serve`) the deployment server in the background;
    with `stores="postgres"`, on PostgreSQL and S3 started first (`services.stores`) instead of SQLite and local files.

    A service whose pid file names a live process is not started again (only waited for until it is healthy); a
    stale pid file is removed. Fails with RuntimeError, naming the URL, when a port is already taken by something
    that is not our service, or when a service exits or is not ready within `timeout_s`.
    Returns {"prefect_ui", "prefect_api", "mlflow_ui"} URLs, and with PostgreSQL {"postgres", "artifacts"}.
    """
    state = Path(state).resolve()
    ep = _endpoints()
    specs = base = _services(state, ep, preset)
    shared = None
    if stores == "postgres":
        shared = shared_stores.SharedStores.from_env(state, _env_port)
        shared.check()
        specs = {**shared.services(), **shared.adapt(specs)}
    elif stores != "local":
        raise ValueError(f"stores={stores!r}: expected one of {', '.join(shared_stores.STORES)}")
    names = [n for n in ORDER if n in specs and (with_serve or n != "serve")]
    _check_same_stores(state, stores)

    running: dict[str, int] = {}
    for name in names:
        pid = live_pid(state, name)
        if pid is None:
            forget(state, name)  # stale or absent
            continue
        running[name] = pid
        recorded = recorded_url(state, name, specs[name].url)
        if recorded != specs[name].url:
            # Probing the new URL would time out; the running copy keeps its address until restarted.
            raise RuntimeError(
                f"{name} is already running at {recorded} (pid {pid}), not at {specs[name].url} as now "
                "configured; run `rlhf down` first to change host or ports."
            )

    # Check every port before starting anything, so a conflict leaves nothing half-started.
    for name in names:
        svc = specs[name]
        if name not in running and svc.port is not None and port_open(ep.client_host, svc.port):
            raise RuntimeError(
                f"cannot start {name}: {svc.url} is already in use by another process (not one started by "
                f"`rlhf up` for {state}). Stop it, or choose another port with "
                f"RLHF_{name.upper()}_PORT."
            )

    started: dict[str, int] = {}
    try:
        if shared is not None:
            shared.prepare()  # the cluster, on first use
        # The services of a phase are independent: start them all, then wait, so their start-up times overlap. The
        # servers come after the stores they use; serve after the Prefect server, whose API it registers through.
        for phase in PHASES:
            todo = [n for n in phase if n in names]
            for name in todo:
                if name not in running:
                    started[name] = spawn(state, specs[name])
            for name in todo:
                wait_ready(state, specs[name], running.get(name) or started[name], timeout_s)
            if shared is not None and phase == shared_stores.NAMES:
                shared.provision(s3_started="s3" in started)  # the S3 key, databases, bucket: before the servers
                specs.update(shared.adapt(base))  # the MLflow server gets the S3 key made just now
    except BaseException:
        # All or nothing: what this call started goes again (serve first), so a failed `up` leaves no
        # half-started set behind; services that were already running are left as they were.
        for name in reversed(ORDER):
            if name in started:
                _stop(state, name, started[name], timeout_s=5.0)
                forget(state, name)
        raise

    return {**urls(state), **(shared.describe() if shared is not None else {})}


def _check_same_stores(state: Path, stores: str) -> None:
    """A running set keeps its stores until `rlhf down`: `up` with the other kind would report it as started."""
    was = shared_stores.recorded_kind(state)
    if was != stores and any(live_pid(state, n) is not None for n in ORDER):
        raise RuntimeError(f"the services of {state} are running with --stores {was}; run `rlhf down` first to "
                           f"start them with --stores {stores}.")
    shared_stores.record_kind(state, stores)


def _stop(state: Path, name: str, pid: int, timeout_s: float) -> None:
    if name == "postgres":
        shared_stores.stop_postgres(state, timeout_s)  # a fast shutdown; the signals below then find it gone
    stop(pid, timeout_s)


def down(state: Path, timeout_s: float = 20) -> list[str]:
    """Stop the services `up` started (serve first, then MLflow, then Prefect, then the stores); returns the names
    stopped.

    SIGTERM to each process group (PostgreSQL: `pg_ctl stop -m fast` first), SIGKILL after `timeout_s`; pid files
    are removed. Nothing running: [].
    """
    state = Path(state).resolve()
    stopped: list[str] = []
    for name in reversed(ORDER):
        pid = live_pid(state, name)
        if pid is not None:
            _stop(state, name, pid, timeout_s)
            stopped.append(name)
        forget(state, name)
    shared_stores.record_kind(state, None)
    return stopped


# ----------------------------------------------------------------------------------------------------------------
# inspection


def urls(state: Path) -> dict[str, str]:
    """{"prefect_ui", "prefect_api", "mlflow_ui"}: where the services run (as recorded by `up`, else per env)."""
    ep = _endpoints()
    prefect_ui = recorded_url(state, "prefect", ep.prefect_ui)
    return {
        "prefect_ui": prefect_ui,
        "prefect_api": f"{prefect_ui}/api",
        "mlflow_ui": recorded_url(state, "mlflow", ep.mlflow_ui),
    }


def status(state: Path) -> dict[str, dict]:
    """Per service: {"pid": int | None, "alive": bool, "url": str, "healthy": bool, "log": str}. The stores
    (postgres, s3) are listed when `up --stores postgres` recorded them."""
    state = Path(state).resolve()
    u = urls(state)
    checks: dict[str, tuple[str, Callable[[], bool]]] = {
        **shared_stores.recorded(state),
        "prefect": (u["prefect_ui"], lambda: healthy(f"{u['prefect_api']}/health")),
        "mlflow": (u["mlflow_ui"], lambda: healthy(f"{u['mlflow_ui']}/health")),
        "serve": (u["prefect_api"], lambda: _serve_ready(u["prefect_api"], started_at(state, "serve"))),
    }
    out: dict[str, dict] = {}
    for name in (n for n in ORDER if n in checks):
        url, answers = checks[name]
        recorded = read_pid(state, name)
        alive = live_pid(state, name) is not None
        out[name] = {
            "pid": recorded[0] if recorded else None,
            "alive": alive,
            "url": url,
            "healthy": alive and answers(),  # a foreign server on the port is not our service being healthy
            "log": str(log_file(state, name)),
        }
    return out


def running_prefect_api(state: Path) -> str | None:
    """The API URL of the Prefect server `rlhf up` started, when it is alive and healthy; else None."""
    state = Path(state).resolve()
    if live_pid(state, "prefect") is None:
        return None
    api = urls(state)["prefect_api"]
    return api if healthy(f"{api}/health") else None
