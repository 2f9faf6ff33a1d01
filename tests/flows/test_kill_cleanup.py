"""A killed run leaves nothing that lies (issue 36, item 5): `kill -9` of `rlhf run` takes its throwaway Prefect
server with it, and the next run on the same state dir marks the killed runs FAILED, deletes model versions
registered from them and removes their half-written outputs (stages/reaper.py, artifact_cache.clean_staging)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from stages.owner import HOST, PID, STARTED, owner_alive, owner_tags
from tests.flows.procs import kill_all


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_owner_alive_tells_a_dead_or_reused_pid():
    me = owner_tags()
    assert owner_alive(me) and owner_alive({})  # untagged runs (older code, another tool) are left alone
    assert not owner_alive({**me, PID: str(_dead_pid())})
    assert not owner_alive({**me, STARTED: "12.00"})  # the pid now belongs to a younger process


def test_reap_fails_dead_owners_runs_and_deletes_their_versions(tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    from stages.reaper import reap

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = MlflowClient()
    exp = client.create_experiment("x", artifact_location=str(tmp_path / "art"))
    dead = {**owner_tags(), PID: str(_dead_pid()), "rlhf.stage": "sft"}
    killed = client.create_run(exp, tags=dead).info.run_id
    alive = client.create_run(exp, tags={**owner_tags(), "rlhf.stage": "sft"}).info.run_id
    elsewhere = client.create_run(exp, tags={**dead, HOST: "another-machine"}).info.run_id
    client.create_registered_model("rlhf-sft")
    client.create_model_version("rlhf-sft", f"runs:/{killed}/model", run_id=killed)
    client.create_model_version("rlhf-sft", f"runs:/{alive}/model", run_id=alive)
    assert reap(exp) == [killed]
    assert client.get_run(killed).info.status == "FAILED" and "ended without finishing" in \
        client.get_run(killed).data.tags["rlhf.failure"]
    assert client.get_run(alive).info.status == "RUNNING" and client.get_run(elsewhere).info.status == "RUNNING"
    assert [mv.run_id for mv in client.search_model_versions("name = 'rlhf-sft'")] == [alive]
    assert reap(exp) == []


def test_clean_staging_removes_only_dead_processes_outputs(tmp_path, monkeypatch):
    from stages import artifact_cache

    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    staging = artifact_cache.staging()
    dead = staging / f"rlhf-sft-{_dead_pid()}-abc"
    live = staging / f"{artifact_cache.staging_prefix('ppo')}def"
    download = staging / "0123abcd-xyz"  # a download's temp dir: cleaned under its key's lock, not here
    for d in (dead, live, download):
        (d / "sub").mkdir(parents=True)
    assert artifact_cache.clean_staging() == [dead]
    assert live.exists() and download.exists() and not dead.exists()


def test_kill_9_leaves_no_server_and_the_next_run_cleans_up(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env["RLHF_HOME"] = str(tmp_path)
    cmd = [sys.executable, "-m", "cli.main", "run", "sft", "--preset", "micro", "--set", "sft.epochs=50"]
    with open(tmp_path / "out.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    children: list[psutil.Process] = []
    try:
        staging = tmp_path / "artifact-cache" / ".staging"
        deadline = time.monotonic() + 300
        while not (staging.exists() and any(staging.glob("rlhf-sft-*"))):  # SFT is training
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()[-3000:]
            time.sleep(0.5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("prefect" in " ".join(c.cmdline()) for c in children)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]  # the throwaway server died with its parent
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
        client = MlflowClient()
        exp = client.get_experiment_by_name("rlhf").experiment_id
        running = client.search_runs([exp], "attributes.status = 'RUNNING'")
        assert len(running) >= 2  # the parent and SFT runs, left RUNNING by the kill

        again = subprocess.run([*cmd[:-2]], env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert client.search_runs([exp], "attributes.status = 'RUNNING'") == []
        for run in running:
            assert client.get_run(run.info.run_id).info.status == "FAILED"
        finished = {r.info.run_id for r in client.search_runs([exp], "attributes.status = 'FINISHED'")}
        assert all(mv.run_id in finished for mv in client.search_model_versions("name = 'rlhf-sft'"))
        assert not any(staging.glob("rlhf-*"))
    finally:
        kill_all([proc, *children])
