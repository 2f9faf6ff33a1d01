"""`rlhf up --stores postgres`: MLflow and Prefect on a real PostgreSQL cluster, artifacts on a real S3 server (moto).

The micro pipeline runs against that set as a user would (`rlhf run` in a subprocess, with nothing but the two
server URLs: no S3 credentials), and behaves as on SQLite and local files: models registered with their lineage, a
fully cached rerun, resume after SIGKILL. Its artifacts are in the bucket and nothing lands in a local store. A
dead S3 server or PostgreSQL behind the live servers is named within seconds.

The slow tests share one set of services (module scope); each prints its wall times (`pytest -s` shows them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import servers as services
from services import stores
from stages.net import ServiceUnreachable, free_port
from tests.stages.test_resume import CMD as RESUME_CMD  # the killed PPO of the SQLite resume test

pytest.importorskip("psycopg2")
pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")

FULL = [sys.executable, "-m", "cli.main", "run", "full", "--preset", "micro", "--json"]
STAGES = ["data", "sft", "reward", "ppo", "eval"]
LOCAL_STORES = ("mlruns", "mlartifacts", "mlflow.db")


def _pg_binaries() -> bool:
    try:
        stores._pg_binary("postgres")
        return True
    except RuntimeError:
        return False


needs_postgres = pytest.mark.skipif(not _pg_binaries(), reason="PostgreSQL server binaries are not installed")


@pytest.fixture
def ports(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    got = {name: free_port() for name in ("POSTGRES", "S3", "PREFECT", "MLFLOW")}
    monkeypatch.setenv("RLHF_HOST", "127.0.0.1")
    for name, port in got.items():
        monkeypatch.setenv(f"RLHF_{name}_PORT", str(port))
    monkeypatch.delenv("RLHF_S3_ENDPOINT_URL", raising=False)
    return got


def test_services_use_the_stores_and_keep_the_password_off_command_lines(tmp_path: Path, ports: dict) -> None:
    shared = stores.SharedStores.from_env(tmp_path, services._env_port)
    specs = shared.adapt(services._services(tmp_path, services._endpoints()))
    mlflow, prefect, serve = specs["mlflow"], specs["prefect"], specs["serve"]
    secret = stores.password(tmp_path)
    assert not any(secret in arg for svc in specs.values() for arg in svc.argv)  # `ps` shows argv to every user
    assert mlflow.argv[-2:] == ["--artifacts-destination", "s3://rlhf-artifacts"]
    assert "--backend-store-uri" not in mlflow.argv and "--default-artifact-root" not in mlflow.argv
    assert mlflow.env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql+psycopg2://rlhf:{secret}@127.0.0.1:{ports['POSTGRES']}/mlflow")
    assert mlflow.env["MLFLOW_S3_ENDPOINT_URL"] == f"http://127.0.0.1:{ports['S3']}"
    assert prefect.env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://rlhf:")
    assert serve.env["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{ports['MLFLOW']}"
    assert "AWS_SECRET_ACCESS_KEY" not in serve.env  # only the MLflow server talks to S3
    assert (tmp_path / "services" / "postgres.password").stat().st_mode & 0o077 == 0


def test_a_dead_s3_endpoint_is_named_within_seconds_and_nothing_starts(tmp_path: Path, ports: dict,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("RLHF_S3_ENDPOINT_URL", dead)
    start = time.monotonic()
    with pytest.raises(ServiceUnreachable, match=dead):
        services.up(tmp_path, with_serve=False, stores="postgres", timeout_s=30)
    assert time.monotonic() - start < stores.PROBE_S + 2
    assert not list((tmp_path / "services").glob("*.pid")) and not stores.pg_dir(tmp_path).exists()


# ----------------------------------------------------------------------------------------------------------------
# the whole set, for real


@pytest.fixture(scope="module")
def shared_set() -> Iterator[dict]:
    """The set of `rlhf up --stores postgres` on free ports, in a state dir the PostgreSQL user can reach (as root,
    the cluster runs as `postgres`, who cannot enter pytest's private tmp dirs)."""
    root = Path(tempfile.mkdtemp(prefix="rlhf-shared-stores-"))
    root.chmod(0o755)
    state = root / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLHF_HOST", "127.0.0.1")
        for name in ("POSTGRES", "S3", "PREFECT", "MLFLOW"):
            mp.setenv(f"RLHF_{name}_PORT", str(free_port()))
        mp.delenv("RLHF_S3_ENDPOINT_URL", raising=False)
        mp.delenv("PREFECT_HOME", raising=False)  # the server's home goes under the state dir, as for a user
        try:
            start = time.monotonic()
            urls = services.up(state, with_serve=False, stores="postgres", timeout_s=240)
            print(f"\nup --stores postgres: {time.monotonic() - start:.1f} s")
            yield {"state": state, "root": root, "urls": urls, "s3": f"http://127.0.0.1:{os.environ['RLHF_S3_PORT']}"}
        finally:
            services.down(state)
            shutil.rmtree(root, ignore_errors=True)


def _client_env(home: Path, urls: dict | None) -> dict[str, str]:
    """A user's shell: the two server URLs (or none: SQLite and local files), and no S3 settings at all."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k not in ("MLFLOW_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI",
                                                    "PREFECT_API_URL")}
    env["RLHF_HOME"] = str(home)
    if urls:
        env |= {"MLFLOW_TRACKING_URI": urls["mlflow_ui"], "PREFECT_API_URL": urls["prefect_api"]}
    return env


def _run(cmd: list[str], home: Path, urls: dict | None, *extra: str) -> tuple[dict, float]:
    start = time.monotonic()
    out = subprocess.run(cmd + list(extra), env=_client_env(home, urls), cwd=home.parent, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), time.monotonic() - start


def _client(urls: dict):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=urls["mlflow_ui"], registry_uri=urls["mlflow_ui"])


def _bucket_keys(endpoint: str, state: Path) -> list[str]:
    from services import s3_auth

    creds = s3_auth.credentials(state)  # the MLflow server's key: the bundled store refuses any other
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=stores.BUCKET)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def _local_stores(*dirs: Path) -> list[Path]:
    return [p for d in dirs for name in LOCAL_STORES for p in d.rglob(name)]


@pytest.fixture(scope="module")
def workdir(shared_set) -> Path:
    """The user's working directory; its `home` is the client's RLHF_HOME."""
    path = shared_set["root"] / "work"
    (path / "home").mkdir(parents=True)
    return path


@pytest.mark.slow
@needs_postgres
def test_micro_pipeline_on_postgres_and_s3_as_on_sqlite(shared_set, workdir) -> None:
    urls, state = shared_set["urls"], shared_set["state"]
    summary, shared_s = _run(FULL, workdir / "home", urls)
    assert [summary["stages"][s]["status"] for s in STAGES] == ["ran"] * 5
    assert summary["mlflow_tracking_uri"] == urls["mlflow_ui"]
    # The default stores, same session, same command: SQLite, local files, a throwaway Prefect server.
    sqlite_home = shared_set["root"] / "sqlite" / "home"
    sqlite_home.mkdir(parents=True)
    baseline, sqlite_s = _run(FULL, sqlite_home, None)
    assert [baseline["stages"][s]["status"] for s in STAGES] == ["ran"] * 5
    print(f"\nmicro pipeline wall time: PostgreSQL + S3 {shared_s:.1f} s, SQLite + local files {sqlite_s:.1f} s")

    # Registry and lineage, as on SQLite.
    client = _client(urls)
    uris = {s: summary["stages"][s]["model_uri"] for s in ("sft", "reward", "ppo")}
    assert uris == {"sft": "models:/rlhf-sft/1", "reward": "models:/rlhf-reward/1", "ppo": "models:/rlhf-policy/1"}
    policy = client.get_model_version("rlhf-policy", "1")
    assert policy.tags["rlhf.upstream.sft"] == uris["sft"] and policy.tags["rlhf.upstream.reward"] == uris["reward"]
    assert client.get_model_version("rlhf-reward", "1").tags["rlhf.upstream.sft"] == uris["sft"]
    assert policy.source.startswith("mlflow-artifacts:/")  # proxied: clients never see the bucket

    # The artifacts are in the bucket, and nothing in a local store: not the user's dir, not the state dir.
    keys = _bucket_keys(shared_set["s3"], state)
    for stage in ("sft", "reward", "ppo"):
        run_id = summary["stages"][stage]["mlflow_run_id"]
        assert any(k.endswith(f"{run_id}/artifacts/model/model.safetensors") for k in keys), stage
    assert _local_stores(workdir, state) == []
    assert not (state / "prefect" / "prefect.db").exists()  # Prefect's database is PostgreSQL's too

    cached, cached_s = _run(FULL, workdir / "home", urls)
    assert [cached["stages"][s]["status"] for s in STAGES] == ["cached"] * 5
    assert cached["stages"]["ppo"]["model_uri"] == uris["ppo"]
    assert len(client.search_model_versions("name = 'rlhf-policy'")) == 1
    print(f"cached rerun: {cached_s:.1f} s")


def _final_metrics(client, run_id: str) -> dict[str, float]:
    metrics = client.get_run(run_id).data.metrics
    last = {k: max(client.get_metric_history(run_id, k), key=lambda m: m.step) for k in metrics}
    return {k: m.value for k, m in last.items() if not k.startswith(("time/", "system/"))}  # host measurements


@pytest.mark.slow
@needs_postgres
def test_killed_ppo_resumes_from_its_s3_checkpoint(shared_set, workdir) -> None:
    """tests/stages/test_resume.py against the shared set: the checkpoint is read back from the bucket."""
    urls, home = shared_set["urls"], workdir / "home"
    start = time.monotonic()
    before = set(_bucket_keys(shared_set["s3"], shared_set["state"]))  # the earlier pipeline's PPO has an iter_000002 checkpoint too
    proc = subprocess.Popen(RESUME_CMD, env=_client_env(home, urls), cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    # The marker is uploaded after the checkpoint's files: only then is it a checkpoint resume can use.
    while not any(k.endswith("checkpoints/iter_000002/COMPLETE") for k in set(_bucket_keys(shared_set["s3"], shared_set["state"])) - before):
        assert proc.poll() is None and time.monotonic() < deadline, "PPO ended before its first checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    resumed, _ = _run(RESUME_CMD, home, urls)
    assert resumed["stages"]["ppo"]["status"] == "ran"
    client = _client(urls)
    new_run = client.get_run(resumed["stages"]["ppo"]["mlflow_run_id"])
    old_id = new_run.data.tags["rlhf.resumed_from"].split("/")[0]
    assert client.get_run(old_id).info.status == "FAILED"
    reference, _ = _run(RESUME_CMD, home, urls, "--force", "ppo")
    assert _final_metrics(client, new_run.info.run_id) == _final_metrics(
        client, reference["stages"]["ppo"]["mlflow_run_id"])
    assert len(client.get_metric_history(new_run.info.run_id, "objective/kl")) == 14
    assert _local_stores(workdir, shared_set["state"]) == []
    print(f"\nkill, resume and reference PPO runs: {time.monotonic() - start:.1f} s")


@pytest.mark.slow
@needs_postgres
def test_a_dead_store_behind_a_live_server_is_named_within_seconds(shared_set, workdir) -> None:
    """The servers still answer /health; `stores.preflight` asks each for its store. Last: it stops the stores."""
    urls, state = shared_set["urls"], shared_set["state"]
    stores.preflight(urls["mlflow_ui"], urls["prefect_api"])  # all up: passes

    os.kill(services.status(state)["s3"]["pid"], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ServiceUnreachable, match=f"MLflow tracking server {urls['mlflow_ui']} .* artifact store"):
        stores.preflight(urls["mlflow_ui"], urls["prefect_api"])
    assert time.monotonic() - start < stores.PROBE_S

    stores.stop_postgres(state, timeout_s=20)
    start = time.monotonic()
    with pytest.raises(ServiceUnreachable, match=f"Prefect API at {urls['prefect_api']} .*database"):
        stores.preflight(urls["mlflow_ui"], urls["prefect_api"])
    with pytest.raises(ServiceUnreachable, match=f"MLflow tracking server {urls['mlflow_ui']} .*database"):
        stores.preflight(urls["mlflow_ui"], None)
    assert time.monotonic() - start < stores.PROBE_S
    # `rlhf run` itself: the Prefect server is the first to need its database.
    start = time.monotonic()
    out = subprocess.run(FULL, env=_client_env(workdir / "home", urls), cwd=workdir, capture_output=True, text=True,
                         timeout=300)
    took = time.monotonic() - start
    print(f"\nrun against a stopped PostgreSQL failed after {took:.1f} s")
    assert out.returncode != 0 and urls["prefect_api"] in out.stderr
    assert took < 30
    assert not any(services.status(state)[name]["healthy"] for name in stores.NAMES)
