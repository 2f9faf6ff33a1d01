"""Dead services and bad input fail fast with an error that names the place."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_dead_prefect_api_is_named_within_seconds(tmp_path):
    url = f"http://127.0.0.1:{_dead_port()}/api"
    t0 = time.monotonic()
    out = _run("run", "sft", "--preset", "micro", RLHF_HOME=str(tmp_path), PREFECT_API_URL=url)
    assert out.returncode != 0 and url in out.stderr
    assert time.monotonic() - t0 < 60  # fails fast, never hangs


def test_dead_mlflow_server_is_named(tmp_path):
    url = f"http://127.0.0.1:{_dead_port()}"
    out = _run("run", "sft", "--preset", "micro", RLHF_HOME=str(tmp_path), MLFLOW_TRACKING_URI=url)
    assert out.returncode != 0 and url in out.stderr


def test_unknown_preset_and_missing_config_file_are_named(tmp_path):
    out = _run("run", "full", "--preset", "nope")
    assert out.returncode != 0 and "unknown preset 'nope'" in out.stderr
    out = _run("run", "full", "--config", str(tmp_path / "missing.yaml"))
    assert out.returncode != 0 and "missing.yaml does not exist" in out.stderr
