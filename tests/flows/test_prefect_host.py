"""The Prefect servers this project starts answer only their own Host names (services/prefect_server.py): a DNS
rebinding page's request is refused, a local client's is served."""

from __future__ import annotations

import os

import httpx

from services.prefect_server import allowed_hosts


def test_allowed_hosts():
    assert allowed_hosts({}) == ["127.0.0.1", "localhost", "::1"]
    assert allowed_hosts({"RLHF_BIND_HOST": "0.0.0.0"}) == ["127.0.0.1", "localhost", "::1"]
    assert allowed_hosts({"RLHF_BIND_HOST": "10.0.0.5", "RLHF_ALLOWED_HOSTS": " prefect.lab , 10.0.0.5"}) == [
        "127.0.0.1", "localhost", "::1", "10.0.0.5", "prefect.lab"]


def test_the_throwaway_server_refuses_a_foreign_host_header(tmp_path, monkeypatch):
    from services.ephemeral import EphemeralPrefect

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    server = EphemeralPrefect()
    try:
        server.wait()
        health = f"{server.api_url}/health"
        assert httpx.get(health, timeout=10).status_code == 200
        assert httpx.get(health, headers={"Host": f"localhost:{server.port}"}, timeout=10).status_code == 200
        evil = httpx.post(f"{server.api_url}/flow_runs/filter", json={}, timeout=10,
                          headers={"Host": "rebind.evil.example", "Origin": "http://rebind.evil.example"})
        assert evil.status_code == 400 and "Invalid host header" in evil.text
    finally:
        server.stop()
    assert os.environ.get("PREFECT_API_URL") != server.api_url
