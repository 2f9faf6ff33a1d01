"""`rlhf up` / `rlhf down` plumbing: real Prefect and MLflow servers on free loopback ports in a tmp state dir."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from services import procs
from services import servers as services
from services.prefect_tuning import SERVER_BATCHING
from stages.net import free_port, healthy, port_open


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def ports(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    prefect_port, mlflow_port = free_port(), free_port()
    monkeypatch.setenv("RLHF_HOST", "127.0.0.1")
    monkeypatch.setenv("RLHF_PREFECT_PORT", str(prefect_port))
    monkeypatch.setenv("RLHF_MLFLOW_PORT", str(mlflow_port))
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    for key in SERVER_BATCHING:
        monkeypatch.delenv(key, raising=False)
    return prefect_port, mlflow_port


@pytest.fixture
def state(tmp_path: Path, ports: tuple[int, int]) -> Iterator[Path]:
    path = tmp_path / "state"
    try:
        yield path
    finally:
        services.down(path)  # never leak a server, whatever the test did


def test_up_status_idempotent_down(state: Path, ports: tuple[int, int]) -> None:
    prefect_port, mlflow_port = ports
    assert services.down(state) == []  # nothing running yet
    assert services.running_prefect_api(state) is None

    got = services.up(state, with_serve=False, timeout_s=90)
    assert got == {
        "prefect_ui": f"http://127.0.0.1:{prefect_port}",
        "prefect_api": f"http://127.0.0.1:{prefect_port}/api",
        "mlflow_ui": f"http://127.0.0.1:{mlflow_port}",
    }
    assert healthy(f"{got['prefect_api']}/health") and healthy(f"{got['mlflow_ui']}/health")
    assert services.running_prefect_api(state) == got["prefect_api"]
    with urllib.request.urlopen(f"{got['prefect_api']}/admin/settings", timeout=10) as resp:
        server = json.load(resp)["server"]["services"]  # the write batching of services.prefect_tuning reached it
    assert server["task_run_recorder"]["batch_size"] == int(SERVER_BATCHING[
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"])
    assert server["event_persister"]["batch_size"] == int(SERVER_BATCHING[
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE"])

    st = services.status(state)
    for name in ("prefect", "mlflow"):
        assert st[name]["alive"] and st[name]["healthy"], st
        assert (state / "services" / f"{name}.pid").is_file()
        assert (state / "services" / f"{name}.log").is_file()
    assert st["serve"] == {**st["serve"], "pid": None, "alive": False, "healthy": False}
    assert (state / "prefect").is_dir() and (state / "mlflow.db").is_file()  # everything under the state dir

    # A second `up` finds both running and starts nothing.
    assert services.up(state, with_serve=False, timeout_s=10) == got
    st2 = services.status(state)
    assert [st2[n]["pid"] for n in ("prefect", "mlflow")] == [st[n]["pid"] for n in ("prefect", "mlflow")]

    pids = [st[n]["pid"] for n in ("prefect", "mlflow")]
    assert services.down(state) == ["mlflow", "prefect"]
    assert not any(_pid_exists(p) for p in pids)
    assert not port_open("127.0.0.1", prefect_port) and not port_open("127.0.0.1", mlflow_port)
    assert not list((state / "services").glob("*.pid"))
    assert services.running_prefect_api(state) is None
    assert services.down(state) == []


def test_port_taken_by_foreign_process(state: Path, ports: tuple[int, int]) -> None:
    prefect_port, _ = ports
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", prefect_port))
        listener.listen()
        with pytest.raises(RuntimeError, match=f"http://127.0.0.1:{prefect_port}"):
            services.up(state, with_serve=False, timeout_s=5)
    # Ports are checked before anything starts: no server was left behind.
    assert not list((state / "services").glob("*.pid"))
    assert services.down(state) == []


def test_stale_pid_file_is_ignored(state: Path) -> None:
    sdir = state / "services"
    sdir.mkdir(parents=True)
    (sdir / "prefect.pid").write_text("999999999\n")  # beyond pid_max: surely not running
    st = services.status(state)
    assert st["prefect"]["pid"] == 999999999 and not st["prefect"]["alive"] and not st["prefect"]["healthy"]
    # A pid the OS gave to another process since (here: this test's own) is not the service.
    (sdir / "mlflow.pid").write_text(f"{os.getpid()} 12345.0\n")
    assert not services.status(state)["mlflow"]["alive"] and procs.live_pid(state, "mlflow") is None
    assert procs.alive(os.getpid()) and procs.alive(os.getpid(), psutil.Process().create_time())
    assert services.running_prefect_api(state) is None
    assert services.down(state) == []
    assert not (sdir / "prefect.pid").exists()


def test_failed_start_names_service_url_and_log_and_rolls_back(
    state: Path, ports: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in commands, no real servers: prefect exits at once, mlflow would hang; `up` leaves neither."""
    prefect_port, _ = ports
    real = services._services

    def fake(state_: Path, ep: services._Endpoints, preset: str = "demo") -> dict[str, services.Service]:
        specs = real(state_, ep, preset)
        return {
            **specs,
            "prefect": dataclasses.replace(
                specs["prefect"], argv=[sys.executable, "-c", "print('boom: no database'); raise SystemExit(3)"]
            ),
            "mlflow": dataclasses.replace(
                specs["mlflow"], argv=[sys.executable, "-c", "import time; time.sleep(60)"]
            ),
        }

    spawned: list[int] = []
    real_spawn = services.spawn

    def recording_spawn(state_: Path, svc: services.Service) -> int:
        spawned.append(real_spawn(state_, svc))
        return spawned[-1]

    monkeypatch.setattr(services, "_services", fake)
    monkeypatch.setattr(services, "spawn", recording_spawn)
    with pytest.raises(RuntimeError) as err:
        services.up(state, with_serve=False, timeout_s=10)
    msg = str(err.value)
    assert "prefect" in msg and f"http://127.0.0.1:{prefect_port}" in msg and "boom: no database" in msg
    assert len(spawned) == 2
    time.sleep(0.2)
    assert not any(procs.alive(p) for p in spawned)
    assert not list((state / "services").glob("*.pid"))
