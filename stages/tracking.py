"""MLflow plumbing for the stages: the tracking store, the experiment, stage runs, artifacts and registered models.

The client API with explicit run ids is used throughout (not the fluent active-run stack), so logging does not
depend on which thread Prefect runs a task in. Every call retries by one policy (`stages.retry`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

from rlhf_lib.redaction import redact
from stages import retry
from stages.home import file_lock, state_dir
from stages.net import ArtifactNotFound, ServiceUnreachable, require_healthy
from stages.owner import owner_tags
from stages.retry import configure_client, retrying, transient

EXPERIMENT = "rlhf"
MODEL_NAMES = {"sft": "rlhf-sft", "reward": "rlhf-reward", "ppo": "rlhf-policy", "dpo": "rlhf-dpo"}
MAX_BUFFERED_METRICS = 200_000
# A training loop logs every step: its metrics are sent at most this often, all of them, in order; after a failed
# send the next try waits `SEND_BACKOFF_S`, so a dead store costs the loop one request timeout per that period.
SEND_EVERY_S = 1.0
SEND_BACKOFF_S = 30.0
_clock = time.monotonic
_log = logging.getLogger(__name__)

# The user's own setting, read once: `mlflow.set_tracking_uri` exports MLFLOW_TRACKING_URI itself, so reading the
# variable later would pin every later pipeline run in this process to the first run's store.
_USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri() -> str:
    return _USER_TRACKING_URI or f"sqlite:///{state_dir() / 'mlflow.db'}"


def setup_mlflow() -> str:
    """Point MLflow at the tracking store and make sure the `rlhf` experiment exists; returns its id."""
    uri = tracking_uri()
    configure_client()
    if uri.startswith(("http://", "https://")):
        require_healthy(uri, "MLflow tracking server", "Start it with `rlhf up`, or unset MLFLOW_TRACKING_URI to use "
                        "the local store.")
    mlflow.set_tracking_uri(uri)
    # set_tracking_uri also exports MLFLOW_TRACKING_URI for child processes; a later `rlhf` child with another
    # RLHF_HOME must not inherit this run's store, so the variable goes back to what the user set.
    if _USER_TRACKING_URI is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    if not uri.startswith("sqlite:///"):
        return store_call("open the experiment", _ensure_experiment, uri)
    # Two processes creating a fresh SQLite store at once race in its schema migrations: take turns.
    with file_lock("mlflow-store"):
        return _open_sqlite_store(uri)


def _open_sqlite_store(uri: str) -> str:
    """`_ensure_experiment` on a SQLite store. Opening the store reads its schema outside MLflow's error handling, so
    a writer holding the lock for longer than SQLite's 5 s busy timeout (another `rlhf` run on the same state dir)
    surfaces as a bare `sqlite3.OperationalError`: waited out by the retry policy, then named."""
    from sqlalchemy.exc import OperationalError

    try:
        return retrying("open the store", _ensure_experiment, uri,
                        retry_on=lambda e: isinstance(e, OperationalError) and "locked" in str(e))
    except OperationalError as e:
        if "locked" not in str(e):
            raise
        raise ServiceUnreachable(f"MLflow store {uri.removeprefix('sqlite:///')} stayed locked by another process "
                                 "(another `rlhf` run writing to the same RLHF_HOME?). Wait for it, or use another "
                                 "RLHF_HOME.") from None


def _ensure_experiment(uri: str) -> str:
    client = MlflowClient()
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        return exp.experiment_id
    # Artifacts live beside the store as plain files, so a local run and the `rlhf up` server share them.
    location = None if uri.startswith("http") else (state_dir() / "mlartifacts").as_uri()
    try:
        # The kind tag makes the MLflow UI open the experiment on its training-runs view, not the GenAI one.
        return client.create_experiment(EXPERIMENT, artifact_location=location,
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except mlflow.exceptions.MlflowException:  # created concurrently by another run
        return client.get_experiment_by_name(EXPERIMENT).experiment_id


def store_call(what: str, fn, *args, **kwargs):
    """An MLflow call under the retry policy; a store that stays down fails with one message naming it."""
    try:
        return retrying(what, fn, *args, **kwargs)
    except Exception as e:
        if not transient(e):
            raise
        raise ServiceUnreachable(f"the MLflow tracking store {tracking_uri()} did not answer ({what}) within "
                                 f"{retry.MAX_WAIT_S:.0f} s of retries: {e}") from e


class RetryingClient:
    """An `MlflowClient` whose every call goes through the retry policy (`store_call`)."""

    def __init__(self) -> None:
        self._client = MlflowClient()

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: store_call(name, attr, *args, **kwargs)


class StageRun:
    """One nested MLflow run of a stage, logged by id. Metrics are buffered and sent in batches, so a training loop
    neither pays a round trip per step nor waits for a store that is down."""

    def __init__(self, experiment_id: str, stage: str, parent_run_id: str | None, run_name: str, tags: dict):
        self.client = MlflowClient()
        all_tags = {"rlhf.stage": stage, **owner_tags(), **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        self.run = store_call("create_run", self.client.create_run, experiment_id, run_name=run_name, tags=all_tags)
        self.run_id = self.run.info.run_id
        self.stage = stage
        self._pending: list[Metric] = []
        self._deferred: list[tuple[str, Any, tuple, dict]] = []
        self._next_send = float("-inf")

    @property
    def artifact_uri(self) -> str:
        return self.run.info.artifact_uri

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Buffer the metrics and, at most every `SEND_EVERY_S` seconds, try once to send everything buffered. A
        store that is down costs training nothing: the metrics go with a later call (none is lost), and `flush()`
        at the end of the stage waits for the store by the retry policy."""
        ts = int(time.time() * 1000)
        self._pending += [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        if _clock() >= self._next_send:
            self.send_pending()

    def later(self, what: str, fn, *args, **kwargs) -> None:
        """A write of the training loop (a sample table, an alarm's tag): sent with the buffered metrics, so a store
        that is down never stalls the loop; `flush()` sends what is left."""
        self._deferred.append((what, fn, args, kwargs))
        if _clock() >= self._next_send:
            self.send_pending()

    def send_pending(self) -> bool:
        """One attempt to send everything buffered; on a transient failure keep it (flush past the cap). Returns
        whether everything went."""
        try:
            self._send()
            while self._deferred:
                _, fn, args, kwargs = self._deferred[0]
                fn(*args, **kwargs)
                self._deferred.pop(0)
            self._next_send = _clock() + SEND_EVERY_S
            return True
        except Exception as e:
            if not transient(e):
                raise
            self._next_send = _clock() + SEND_BACKOFF_S
            _log.warning("MLflow unreachable, %d metrics and %d writes kept for run %s (next try in %.0f s): %s",
                         len(self._pending), len(self._deferred), self.run_id, SEND_BACKOFF_S, e)
            if len(self._pending) > MAX_BUFFERED_METRICS:
                self.flush()
            return False

    def flush(self) -> None:
        """Send every buffered metric and write, waiting for the store by the retry policy."""
        store_call("log_metrics", self._send)
        while self._deferred:
            what, fn, args, kwargs = self._deferred[0]
            store_call(what, fn, *args, **kwargs)
            self._deferred.pop(0)
        self._next_send = _clock() + SEND_EVERY_S

    def _send(self) -> None:
        while self._pending:
            chunk = self._pending[:900]  # the API takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=chunk)
            del self._pending[: len(chunk)]

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, redact(k, v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 90):
            store_call("log_params", self.client.log_batch, self.run_id, params=items[i : i + 90])

    def set_tags(self, tags: dict[str, Any], wait: bool = True) -> None:
        items = [RunTag(k, redact(k, v)) for k, v in tags.items()]
        if wait:
            store_call("set_tags", self.client.log_batch, self.run_id, tags=items)
        else:
            self.later("set_tags", self.client.log_batch, self.run_id, tags=items)

    def log_dir(self, local_dir: Path, artifact_path: str, wait: bool = True) -> None:
        """Upload a directory (a checkpoint, a model). The metrics logged before it are sent first, so a store that
        holds a checkpoint also holds every metric up to it (a resumed run copies those; stages/resume.py). With
        `wait=False` each call is tried once (the PPO loop does not wait for a store that is down)."""
        if wait:
            self.flush()
            store_call("log_artifacts", self.client.log_artifacts, self.run_id, str(local_dir), artifact_path)
        else:
            if not self.send_pending():
                raise ConnectionError(f"MLflow store {tracking_uri()} is unreachable")
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def delete_artifacts(self, artifact_path: str, wait: bool = True) -> None:
        """Delete a logged file or dir of this run (an old checkpoint), by the artifact repository's API; with
        `wait=False` tried once."""
        repo = get_artifact_repository(self.artifact_uri)
        if wait:
            store_call("delete_artifacts", repo.delete_artifacts, artifact_path)
        else:
            repo.delete_artifacts(artifact_path)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        store_call("log_dict", self.client.log_dict, self.run_id, obj, artifact_file)

    def log_text(self, text: str, artifact_file: str, wait: bool = True) -> None:
        if wait:
            store_call("log_text", self.client.log_text, self.run_id, text, artifact_file)
        else:
            self.client.log_text(self.run_id, text, artifact_file)

    def log_table(self, rows: list[dict], artifact_file: str, wait: bool = True) -> None:
        import pandas as pd

        args = (mlflow.log_table, pd.DataFrame(rows))
        kwargs = {"artifact_file": artifact_file, "run_id": self.run_id}
        if wait:
            store_call("log_table", *args, **kwargs)
        else:
            self.later("log_table", *args, **kwargs)

    def finish(self, status: str = "FINISHED") -> None:
        store_call("set_terminated", self.client.set_terminated, self.run_id, status)


def newest_runs(experiment_id: str, stage: str, where: str, max_results: int = 5) -> list:
    """The newest runs of `stage` in the experiment that also match the MLflow filter `where`."""
    return store_call("search_runs", mlflow.search_runs, [experiment_id],
                      filter_string=f"tags.`rlhf.stage` = '{stage}' and {where}",
                      order_by=["attributes.start_time DESC"], output_format="list", max_results=max_results)


def register(run: StageRun, artifact_path: str, tags: dict[str, str]) -> str:
    """Register `<run artifacts>/<artifact_path>` as a new version of the stage's model; returns `models:/n/v`."""
    name = MODEL_NAMES[run.stage]
    client = run.client
    try:
        client.create_registered_model(name, description=f"rlhf-pipeline {run.stage} models")
    except mlflow.exceptions.MlflowException as e:
        if transient(e):
            raise
    source = f"{run.artifact_uri}/{artifact_path}"
    # Idempotent: a retried publish must not register the same run's artifacts twice.
    for mv in client.search_model_versions(f"name = '{name}' and run_id = '{run.run_id}'"):
        if mv.source == source:
            return f"models:/{name}/{mv.version}"
    mv = client.create_model_version(name, source=source, run_id=run.run_id, tags={k: str(v) for k, v in tags.items()})
    return f"models:/{name}/{mv.version}"



def model_version(uri: str):
    """The registry entry behind `models:/name/version` or `models:/name@alias`, or a clear error naming it."""
    ref = uri.removeprefix("models:/")
    name, sep, alias = ref.partition("@")
    client = RetryingClient()
    try:
        if sep:
            return client.get_model_version_by_alias(name, alias)
        name, _, version = ref.partition("/")
        if version == "latest":
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise ArtifactNotFound(f"no registered model {uri}: {name} has no versions")
            return max(versions, key=lambda mv: int(mv.version))
        return client.get_model_version(name, version)
    except mlflow.exceptions.MlflowException as e:
        raise ArtifactNotFound(f"no registered model {uri}: {e.message} (list the versions in the MLflow UI's "
                               "Models page, or with `MlflowClient().search_model_versions`)") from None
