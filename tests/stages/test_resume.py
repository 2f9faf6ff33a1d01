"""Exact resume: SIGKILL a PPO stage mid-run, rerun the same command, and get the metrics of an uninterrupted run."""

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

# Every checkpoint is kept, so the first one stays for the poller below however far behind its uploads a loaded
# host runs (with the default two kept, it is gone once the third is up).
CMD = [sys.executable, "-m", "cli.main", "run", "ppo", "--preset", "micro", "--json",
       "--set", "ppo.iterations=14", "--set", "ppo.checkpoint_every=2", "--set", "ppo.keep_checkpoints=null"]


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    return env | {"RLHF_HOME": str(home)}


def _run(home: Path, *extra: str) -> dict:
    out = subprocess.run(CMD + list(extra), env=_env(home), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _final_metrics(home: Path, run_id: str) -> dict:
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    metrics = client.get_run(run_id).data.metrics
    last = {k: max(client.get_metric_history(run_id, k), key=lambda m: m.step) for k in metrics}
    return {k: m.value for k, m in last.items() if not k.startswith(("time/", "system/"))}


def test_killed_ppo_resumes_to_the_uninterrupted_result(tmp_path):
    home = tmp_path
    # Warm the upstream stages so that the killed attempt is inside PPO when the first checkpoint lands.
    subprocess.run([sys.executable, "-m", "cli.main", "run", "reward", "--preset", "micro"],
                   env=_env(home), check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(CMD, env=_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    # The marker is logged after the checkpoint's files: only then is it a checkpoint resume can use.
    while not list(home.glob("mlartifacts/*/artifacts/checkpoints/iter_000002/COMPLETE")):
        assert proc.poll() is None and time.monotonic() < deadline, "PPO ended before its first checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    resumed = _run(home)
    assert resumed["stages"]["ppo"]["status"] == "ran"
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    new_run = client.get_run(resumed["stages"]["ppo"]["mlflow_run_id"])
    old_id = new_run.data.tags["rlhf.resumed_from"].split("/")[0]
    assert client.get_run(old_id).info.status == "FAILED"  # never left RUNNING
    # The reference: the same PPO, uninterrupted, from the same upstream artifacts. (Across processes that trained
    # their own SFT and RM, CPU kernels may round differently in the last bit; here both read the same files.)
    reference = _run(home, "--force", "ppo")
    ref_metrics = _final_metrics(home, reference["stages"]["ppo"]["mlflow_run_id"])
    assert _final_metrics(home, new_run.info.run_id) == ref_metrics
    # The whole curve is in the new run, one point per iteration.
    assert len(client.get_metric_history(new_run.info.run_id, "objective/kl")) == 14
