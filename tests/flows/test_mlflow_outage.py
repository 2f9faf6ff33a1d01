"""A real MLflow server is killed in the middle of PPO and restarted: PPO's iterations go on while it is down, the
pipeline waits for it at the end of the stage, loses no metric, and registers each model once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from stages.net import free_port, healthy

pytestmark = pytest.mark.slow

ITERATIONS = 40


def _start_server(store: Path, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
            (store / "artifacts").as_uri()]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(argv, cwd=store, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while not healthy(f"{url}/health"):
        assert proc.poll() is None and time.time() < deadline, "mlflow server did not start"
        time.sleep(0.5)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # a crash, not a polite shutdown
    proc.wait(timeout=30)


def _ppo_step(client: MlflowClient) -> int:
    """The highest PPO iteration logged so far (-1 before any)."""
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], "tags.`rlhf.stage` = 'ppo'"):
            history = client.get_metric_history(run.info.run_id, "objective/kl")
            return max((m.step for m in history), default=-1)
    return -1


def test_pipeline_survives_an_mlflow_server_restart_mid_ppo(tmp_path):
    store = tmp_path / "server"
    store.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start_server(store, port)
    env = {**os.environ, "RLHF_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": url}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "cli.main", "run", "full", "--preset", "micro", "--json",
           "--set", f"ppo.iterations={ITERATIONS}", "--set", "ppo.checkpoint_every=5"]
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = MlflowClient(tracking_uri=url, registry_uri=url)
        deadline = time.time() + 600
        while _ppo_step(client) < 2:
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.time() < deadline
            time.sleep(0.5)
        _stop(server)
        down_at = time.time()
        time.sleep(5)
        assert run.poll() is None, "the pipeline must still be running during the outage"
        server = _start_server(store, port)
        up_at = time.time()
        out, err = run.communicate(timeout=900)
        assert run.returncode == 0, err[-3000:]
        assert "MLflow" in err  # the outage was noticed and reported, not silently skipped
        summary = json.loads(out.strip().splitlines()[-1])

        ppo = client.get_run(summary["stages"]["ppo"]["mlflow_run_id"])
        assert ppo.info.status == "FINISHED"
        for key in ("objective/kl", "loss/total", "response/length_mean"):
            steps = sorted(m.step for m in client.get_metric_history(ppo.info.run_id, key))
            assert steps == list(range(ITERATIONS)), key  # every iteration's metrics arrived, none twice
        # A metric's timestamp is when the loop logged it: iterations ran while the server was down.
        during = [m.step for m in client.get_metric_history(ppo.info.run_id, "objective/kl")
                  if down_at * 1000 <= m.timestamp <= up_at * 1000]
        assert len(during) >= 5, (during, up_at - down_at)
        for name in ("rlhf-sft", "rlhf-reward", "rlhf-policy"):
            assert len(client.search_model_versions(f"name = '{name}'")) == 1, name
        checkpoints = {a.path.split("/")[-1] for a in client.list_artifacts(ppo.info.run_id, "checkpoints")}
        assert f"iter_{ITERATIONS:06d}" in checkpoints
    finally:
        if run.poll() is None:
            run.kill()
        if server.poll() is None:
            _stop(server)
