"""Two pipelines started at the same moment on one state dir: both complete, and each stage is trained and
registered once (the per-key lock makes the second wait for the first one's result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlflow import MlflowClient


def test_two_simultaneous_runs_both_complete_and_register_once(tmp_path):
    env = {**os.environ, "RLHF_HOME": str(tmp_path)}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "cli.main", "run", "reward", "--preset", "micro", "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    for stage in ("data", "sft", "reward"):
        assert sorted(s["stages"][stage]["status"] for s in summaries) == ["cached", "ran"], stage
        assert summaries[0]["stages"][stage]["mlflow_run_id"] == summaries[1]["stages"][stage]["mlflow_run_id"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for name in ("rlhf-sft", "rlhf-reward"):
        assert len(client.search_model_versions(f"name = '{name}'")) == 1, name
    rm = client.get_run(summaries[0]["stages"]["reward"]["mlflow_run_id"]).data.metrics
    for s in summaries:  # a pipeline that ends at the RM reports its held-out accuracy, ran or cached
        assert s["eval"]["reward_model_accuracy"] == rm["reward/heldout_accuracy"]
        assert s["eval"]["reward_model_accuracy_ci95"] == [rm["reward/heldout_accuracy_ci95_low"],
                                                           rm["reward/heldout_accuracy_ci95_high"]]
