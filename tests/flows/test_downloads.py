"""Artifacts move once: the micro pipeline against a real MLflow server that proxies its artifacts (every read is an
HTTP download), counting the downloads of the one function that makes them (`stages.artifact_cache.transfer`).

A run downloads nothing it uploaded itself, a fully cached rerun downloads nothing, and on a machine with an empty
artifact cache a fully cached run downloads each artifact it reads at most once and no model at all."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from cli.main import load_config
from stages import artifact_cache, tracking
from stages.net import free_port, healthy

pytestmark = pytest.mark.slow
STAGES = ["data", "sft", "reward", "ppo", "eval"]


@pytest.fixture(scope="module")
def server(home, tmp_path_factory):
    """An MLflow server with `--artifacts-destination` (artifacts over HTTP, `mlflow-artifacts:/` URIs), used as the
    user's tracking URI for this module."""
    store = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
            (store / "artifacts").as_uri()]
    proc = subprocess.Popen(argv, cwd=store, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not healthy(f"{url}/health"):
            assert proc.poll() is None and time.time() < deadline, "mlflow server did not start"
            time.sleep(0.5)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tracking, "_USER_TRACKING_URI", url)
            mp.setenv("MLFLOW_TRACKING_URI", url)
            yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # Later tests of this session must not talk to the dead server (set_tracking_uri also exports the variable).
        mlflow.set_tracking_uri(tracking.tracking_uri())
        os.environ.pop("MLFLOW_TRACKING_URI", None)


class Downloads:
    """Every call of `artifact_cache.transfer`: the location and the bytes it brought."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def locations(self) -> list[str]:
        return [loc for loc, _ in self.calls]

    def record(self, real):
        def transfer(location: str, dst: Path) -> Path:
            got = real(location, dst)
            files = [got] if got.is_file() else [f for f in got.rglob("*") if f.is_file()]
            self.calls.append((location, sum(f.stat().st_size for f in files)))
            return got
        return transfer


@pytest.fixture(scope="module")
def downloads(server):
    counter = Downloads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(artifact_cache, "transfer", counter.record(artifact_cache.transfer))
        yield counter


def run(*overrides: str) -> dict:
    from flows.pipeline import rlhf

    return rlhf(config=load_config("micro", None, list(overrides)), pipeline="full")


def statuses(summary: dict) -> list[str]:
    return [summary["stages"][s]["status"] for s in STAGES]


def test_a_run_and_its_cached_rerun_download_nothing(downloads, home):
    assert statuses(run()) == ["ran"] * 5
    assert downloads.calls == []  # what a stage uploads, the stages downstream read from the cache
    assert statuses(run()) == ["cached"] * 5
    assert downloads.calls == []
    assert list((artifact_cache.root() / ".staging").iterdir()) == []  # no temporary dir left behind


def test_a_cached_run_on_a_fresh_machine_downloads_each_artifact_once_and_no_model(downloads, home):
    shutil.rmtree(artifact_cache.root())  # what a second machine sharing the store starts with
    downloads.calls.clear()
    assert statuses(run()) == ["cached"] * 5
    locations = downloads.locations()
    assert len(locations) == len(set(locations))
    # Look-ups read manifests; the stages read the data files and eval's report, nothing else.
    assert sorted(loc.split("/artifacts/")[-1] for loc in locations) == ["data", "data/manifest.json", "model/manifest.json",
                                            "model/manifest.json", "model/manifest.json", "report"]
    downloads.calls.clear()
    assert statuses(run()) == ["cached"] * 5 and downloads.calls == []


def test_a_stage_that_runs_downloads_each_upstream_model_once_and_prunes_its_checkpoints(downloads, home):
    first = run()
    shutil.rmtree(artifact_cache.root())
    downloads.calls.clear()
    changed = run("ppo.kl_coef=0.1234", "ppo.checkpoint_every=1", "ppo.keep_checkpoints=1")
    assert statuses(changed) == ["cached", "cached", "cached", "ran", "ran"]
    locations = downloads.locations()
    assert len(locations) == len(set(locations))  # nothing twice: eval reuses what PPO downloaded
    models = [loc.split("/")[-3] for loc in locations if loc.endswith("/artifacts/model")]  # their run ids
    assert sorted(models) == sorted(first["stages"][s]["mlflow_run_id"] for s in ("sft", "reward"))
    # Checkpoint 1 was deleted from the store (over HTTP) once checkpoint 2 was complete.
    ppo_run = changed["stages"]["ppo"]["mlflow_run_id"]
    assert [f.path for f in MlflowClient().list_artifacts(ppo_run, "checkpoints")] == ["checkpoints/iter_000002"]
