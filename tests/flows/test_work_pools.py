"""Stages on Prefect work pools, with real services and workers: a Prefect server and an MLflow server (`rlhf up`'s),
two process work pools `cpu` and `gpu`, the shipped prefect.yaml deployed with `prefect deploy --all`, and workers
started with `prefect worker start` in working directories of their own (each its own state dir, so artifacts can
only travel through MLflow).

- `rlhf/full` on `cpu` with `resources.work_pools: {ppo: gpu, eval: cpu}`: the PPO flow run is taken by the `gpu`
  worker, the pipeline and the eval by the `cpu` one; lineage and the registry as in-process; a rerun is all cached.
- `rlhf sweep ppo` with 3 points runs them on 2 `cpu` workers (one run each at a time), in parallel, against the
  cached SFT and RM; the ranking is in MLflow and `champion` follows the best.

The tests share one set of services and run in order (module scope); each prints its wall times (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient

from tests.flows.conftest import local_services

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MICRO_POOLS = {"resources": {"work_pools": {"ppo": "gpu", "eval": "cpu"}, "pool_timeout_s": 300}}


class Cluster:
    def __init__(self, state: Path, urls: dict[str, str]):
        self.state, self.api, self.mlflow = state, urls["prefect_api"], urls["mlflow_ui"]
        self.env = {**os.environ, "PREFECT_API_URL": self.api, "MLFLOW_TRACKING_URI": self.mlflow,
                    "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
        self.env.pop("RLHF_HOME", None)
        self.workers: dict[str, subprocess.Popen] = {}

    def prefect(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    def start_worker(self, name: str, pool: str, limit: int | None = None) -> None:
        """A worker in a working directory of its own, with its own state dir."""
        home = self.state / name
        home.mkdir()
        log = open(home / "worker.log", "w")
        cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--name", name]
        self.workers[name] = subprocess.Popen(cmd + (["--limit", str(limit)] if limit else []), cwd=home,
                                              env={**self.env, "RLHF_HOME": str(home / ".rlhf")}, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)

    def stop_worker(self, name: str) -> None:
        proc = self.workers.pop(name)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)

    def took(self, worker: str, flow_run_id: str) -> bool:
        """Whether `worker` took the flow run (its log line as it submits one)."""
        line = f"Worker '{worker}' submitting flow run '{flow_run_id}'"
        return line in (self.state / worker / "worker.log").read_text()

    def flow_run(self, run_id: str) -> dict:
        return httpx.get(f"{self.api}/flow_runs/{run_id}", timeout=10).json()

    def summary(self, flow_run_id: str) -> dict:
        """The `rlhf` flow run's summary.json, from its MLflow parent run."""
        client = MlflowClient(self.mlflow)
        exp = client.get_experiment_by_name("rlhf")
        runs = client.search_runs([exp.experiment_id], f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'")
        assert runs, f"no MLflow run of flow run {flow_run_id}"
        path = client.download_artifacts(runs[0].info.run_id, "summary.json", str(self.state))
        return json.loads(Path(path).read_text())

    def run_deployment(self, name: str, params: dict) -> str:
        """`prefect deployment run NAME --watch` with these parameters; returns the flow run's id."""
        args = ["deployment", "run", name, "--watch", "--watch-interval", "2"]
        for k, v in params.items():
            args += ["--param", f"{k}={json.dumps(v) if isinstance(v, dict) else v}"]
        out = self.prefect(*args, timeout=900).stdout
        found = re.search(r"UUID:?\s+([0-9a-f-]{36})", out)
        assert found, out
        return found.group(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("pools")
    with local_services(state, with_serve=False, preset="micro") as urls:
        c = Cluster(state, urls)
        try:
            for pool in ("cpu", "gpu"):
                c.prefect("work-pool", "create", pool, "--type", "process")
            t0 = time.perf_counter()
            c.prefect("--no-prompt", "deploy", "--all")
            print(f"\nprefect deploy --all: {time.perf_counter() - t0:.1f} s")
            yield c
        finally:
            for name in list(c.workers):
                c.stop_worker(name)


def test_each_stage_runs_on_the_pool_it_names(cluster):
    cluster.start_worker("cpu-1", "cpu")
    cluster.start_worker("gpu-1", "gpu")
    t0 = time.perf_counter()
    parent = cluster.run_deployment("rlhf/full", {"preset": "micro", "config": MICRO_POOLS})
    print(f"rlhf/full on two pools: {time.perf_counter() - t0:.1f} s")
    assert cluster.flow_run(parent)["state_type"] == "COMPLETED"
    summary = cluster.summary(parent)
    stages = summary["stages"]
    assert {k: s["status"] for k, s in stages.items()} == dict.fromkeys(["data", "sft", "reward", "ppo", "eval"], "ran")
    assert "work_pool" not in stages["sft"] and "work_pool" not in stages["reward"]
    assert stages["ppo"]["work_pool"] == "gpu" and stages["eval"]["work_pool"] == "cpu"
    ppo_run, eval_run = (cluster.flow_run(stages[k]["flow_run_id"]) for k in ("ppo", "eval"))
    assert (ppo_run["work_pool_name"], eval_run["work_pool_name"]) == ("gpu", "cpu")
    assert cluster.flow_run(parent)["work_pool_name"] == "cpu"
    # Which worker took which flow run: each worker logs the runs it submits.
    assert cluster.took("gpu-1", ppo_run["id"]) and not cluster.took("cpu-1", ppo_run["id"])
    assert cluster.took("cpu-1", parent) and cluster.took("cpu-1", eval_run["id"])
    assert not cluster.took("gpu-1", parent) and not cluster.took("gpu-1", eval_run["id"])
    print(f"gpu-1 ran {ppo_run['name']}; cpu-1 ran {cluster.flow_run(parent)['name']} and {eval_run['name']}")
    # The policy's lineage names the SFT and RM versions the pipeline trained, as in one process.
    client = MlflowClient(cluster.mlflow)
    policy = client.get_model_version("rlhf-policy", stages["ppo"]["model_uri"].rsplit("/", 1)[1])
    tags = client.get_run(policy.run_id).data.tags
    assert tags["rlhf.upstream.sft"] == stages["sft"]["model_uri"]
    assert tags["rlhf.upstream.reward"] == stages["reward"]["model_uri"]
    assert summary["eval"]["win_rate_vs_sft"] is not None
    # PPO ran under the gpu worker's own state dir (its key lock is there), the pipeline under cpu-1's.
    assert list((cluster.state / "gpu-1" / ".rlhf" / "locks").glob("ppo-*.lock"))
    assert not list((cluster.state / "gpu-1" / ".rlhf" / "locks").glob("sft-*.lock"))
    # The eval, on cpu-1, found the PPO that gpu-1 trained in the cache: one cache across machines.
    found = cluster.summary(eval_run["id"])["stages"]["ppo"]
    assert (found["status"], found["mlflow_run_id"]) == ("cached", stages["ppo"]["mlflow_run_id"])


def test_a_sweep_runs_its_points_in_parallel_on_two_workers(cluster):
    cluster.stop_worker("cpu-1")
    cluster.stop_worker("gpu-1")
    cluster.start_worker("cpu-a", "cpu", limit=1)
    cluster.start_worker("cpu-b", "cpu", limit=1)
    cmd = [sys.executable, "-m", "cli.main", "sweep", "ppo", "--preset", "micro",
           "--set", "ppo.kl_coef=0.02,0.1,0.3", "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cluster.state, env=cluster.env, capture_output=True, text=True, timeout=900)
    print(f"sweep of 3 points on 2 workers: {time.perf_counter() - t0:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = result["ranking"]
    metric = rows[0]["metric"]
    assert [r["ppo.kl_coef"] for r in rows] and sorted(r["ppo.kl_coef"] for r in rows) == ["0.02", "0.1", "0.3"]
    assert all(r["status"] == "completed" for r in rows)
    assert [r[metric] for r in rows] == sorted((r[metric] for r in rows), reverse=True)
    for r in rows:
        print(f"rank {r['rank']}: kl_coef {r['ppo.kl_coef']} {metric} {r[metric]} {r['policy']}"
              + (" champion" if r["champion"] else ""))
    # Every point trained PPO against the one cached SFT and RM, none retrained them.
    for point in result["points"]:
        assert point["stages"]["sft"]["model_uri"] == result["upstream"]["sft"]
        assert point["stages"]["ppo"]["status"] == "ran"
    # Spread over both workers, and two at once.
    ids = [p["prefect_flow_run_id"] for p in result["points"]]
    assert all(any(cluster.took(w, i) for i in ids) for w in ("cpu-a", "cpu-b"))
    runs = [cluster.flow_run(i) for i in ids]
    spans = sorted((r["start_time"], r["end_time"]) for r in runs)
    assert spans[1][0] < spans[0][1], f"no two points overlapped: {spans}"
    # MLflow: the sweep's run holds the ranking, each point's run is nested under it; champion follows the best.
    client = MlflowClient(cluster.mlflow)
    for point in result["points"]:
        assert client.get_run(point["mlflow_run_id"]).data.tags["mlflow.parentRunId"] == result["mlflow_run_id"]
    champion = client.get_model_version_by_alias("rlhf-policy", "champion")
    assert client.get_run(result["mlflow_run_id"]).data.tags["rlhf.champion"] == f"models:/rlhf-policy/{champion.version}"
    best = rows[0]
    held = float(champion.tags.get(f"rlhf.eval.{metric}", "nan")) if champion.tags else None
    if best["champion"]:
        assert best["policy"] == f"models:/rlhf-policy/{champion.version}"
    else:  # the earlier pipeline's policy stays champion only when it scored at least as high
        assert held is not None and held >= best[metric]
