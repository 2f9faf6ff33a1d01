"""MLflow plumbing for the stages: the state dir, the experiment, stage runs, artifacts and registered models.

The client API with explicit run ids is used throughout (not the fluent active-run stack), so logging does not
depend on which thread Prefect runs a task in.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

EXPERIMENT = "rlhf"
RETRY_DELAYS_S = (1, 2, 4, 8, 15)
MAX_BUFFERED_METRICS = 200_000
# A training loop logs every step; sending each step's metrics in its own round trip costs ~5 ms against a local
# SQLite store (~7 % of a demo reward-model step). Metrics are sent at most this often instead, all of them, in order.
SEND_EVERY_S = 1.0
_clock = time.monotonic
# What a store that is down for a moment raises: MLflow's own errors, and connection errors (OSError subclasses).
_TRANSIENT = (mlflow.exceptions.MlflowException, OSError)
_log = logging.getLogger(__name__)
MODEL_NAMES = {"sft": "rlhf-sft", "reward": "rlhf-reward", "ppo": "rlhf-policy"}


def state_dir() -> Path:
    """`$RLHF_HOME`, else `.rlhf/` under the working directory."""
    return Path(os.environ.get("RLHF_HOME") or Path.cwd() / ".rlhf").resolve()


# The user's own setting, read once: `mlflow.set_tracking_uri` exports MLFLOW_TRACKING_URI itself, so reading the
# variable later would pin every later pipeline run in this process to the first run's store.
_USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri() -> str:
    return _USER_TRACKING_URI or f"sqlite:///{state_dir() / 'mlflow.db'}"


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail within seconds, naming the URL, when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status != 200:
                raise ConnectionError(f"MLflow server at {uri} answered {resp.status} on {url}")
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(
            f"MLflow tracking server {uri} is unreachable ({e}). Start it with `rlhf up`, or unset "
            "MLFLOW_TRACKING_URI to use the local store."
        ) from None


def setup_mlflow() -> str:
    """Point MLflow at the tracking store and make sure the `rlhf` experiment exists; returns its id."""
    uri = tracking_uri()
    check_reachable(uri)
    mlflow.set_tracking_uri(uri)
    # set_tracking_uri also exports MLFLOW_TRACKING_URI for child processes; a later `rlhf` child with another
    # RLHF_HOME must not inherit this run's store, so the variable goes back to what the user set.
    if _USER_TRACKING_URI is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    if uri.startswith("sqlite:///"):
        # Two processes creating a fresh SQLite store at once race in its schema migrations: take turns.
        with file_lock("mlflow-store"):
            return _open_sqlite_store(uri)
    return _ensure_experiment(uri)


def _open_sqlite_store(uri: str) -> str:
    """`_ensure_experiment` on a SQLite store, retried while another process holds the database's write lock.

    Opening the store reads its schema outside MLflow's error handling, so a writer that holds the lock for longer
    than SQLite's 5 s busy timeout (another `rlhf` run on the same state dir, busy writing) surfaces as a bare
    `sqlite3.OperationalError`. Retry with backoff, then fail naming the file.
    """
    from sqlalchemy.exc import OperationalError

    start = time.monotonic()
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return _ensure_experiment(uri)
        except OperationalError as e:
            if "locked" not in str(e):
                raise
            if delay is None:
                path, waited = uri.removeprefix("sqlite:///"), time.monotonic() - start
                raise RuntimeError(
                    f"MLflow store {path} stayed locked by another process for {waited:.0f} s (another `rlhf` run "
                    "writing to the same RLHF_HOME?). Wait for it, or use another RLHF_HOME."
                ) from None
            _log.warning("MLflow store %s is locked by another process, retrying in %s s", uri, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


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


@contextmanager
def file_lock(name: str):
    """An exclusive lock file under `<state>/locks/`: processes on this machine sharing the state dir take turns."""
    locks = state_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_SECRET_KEY = re.compile(r"token|secret|password|passwd|api[_-]?key|credential", re.I)
# Hugging Face, OpenAI-style and bearer tokens, and credentials inside URLs (scheme://user:pass@host).
_SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}|Bearer\s+\S+|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)")


def redact(key: str, value: Any) -> str:
    """The value as text for a param or tag, with credentials replaced by `***`: nothing secret reaches MLflow."""
    text = str(value)
    if _SECRET_KEY.search(key):
        return "***"
    return _SECRET_VALUE.sub("***", text)


def dir_digest(path: Path) -> str:
    """sha256 over the relative paths and bytes of every file under `path` (sorted): a content identity."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


class StageRun:
    """One nested MLflow run of a stage, logged by id. Metrics are batched to keep the PPO loop cheap."""

    def __init__(self, experiment_id: str, stage: str, parent_run_id: str | None, run_name: str, tags: dict):
        self.client = MlflowClient()
        all_tags = {"rlhf.stage": stage, **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        self.run = self.client.create_run(experiment_id, run_name=run_name, tags=all_tags)
        self.run_id = self.run.info.run_id
        self.stage = stage
        self._pending: list[Metric] = []
        self._last_send = float("-inf")

    @property
    def artifact_uri(self) -> str:
        return self.run.info.artifact_uri

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Buffer the metrics; at most every `SEND_EVERY_S` seconds, try to send everything pending once. A store
        that fails for a moment costs training nothing, and the metrics go with a later call (none is lost).
        `flush()` at the end of the stage retries with backoff and fails the stage if the store stays down."""
        ts = int(time.time() * 1000)
        self._pending += [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        if _clock() - self._last_send >= SEND_EVERY_S:
            self.send_pending()

    def send_pending(self) -> None:
        """One attempt to send everything pending; on a transient failure keep it buffered (flush past the cap)."""
        self._last_send = _clock()
        try:
            self._send()
        except _TRANSIENT as e:
            _log.warning("MLflow unreachable, %d metrics buffered for run %s: %s", len(self._pending), self.run_id, e)
            if len(self._pending) > MAX_BUFFERED_METRICS:
                self.flush()

    def flush(self) -> None:
        """Send every buffered metric, retrying with backoff (`RETRY_DELAYS_S`); raise if the store stays down."""
        for delay in (*RETRY_DELAYS_S, None):
            try:
                self._send()
                return
            except _TRANSIENT:
                if delay is None:
                    raise
                time.sleep(delay)

    def _send(self) -> None:
        while self._pending:
            chunk = self._pending[:900]  # the API takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=chunk)
            del self._pending[: len(chunk)]

    def _retrying(self, what: str, fn, *args, **kwargs):
        """Call an MLflow write, retrying a failure with backoff (`RETRY_DELAYS_S`, on top of the client's own HTTP
        retries) before giving up: a server restarting mid-run costs a pause, not the run."""
        for delay in (*RETRY_DELAYS_S, None):
            try:
                return fn(*args, **kwargs)
            except _TRANSIENT as e:
                if delay is None:
                    raise
                _log.warning("MLflow %s for run %s failed, retrying in %s s: %s", what, self.run_id, delay, e)
                time.sleep(delay)

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, redact(k, v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self._retrying("log_params", self.client.log_batch, self.run_id, params=items[i : i + 90])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._retrying("set_tags", self.client.log_batch, self.run_id,
                       tags=[RunTag(k, redact(k, v)) for k, v in tags.items()])

    def log_dir(self, local_dir: Path, artifact_path: str) -> None:
        """Upload a directory (a checkpoint, a model). The metrics logged before it are sent first, so a store that
        holds a checkpoint also holds every metric up to it (a resumed run copies those; stages/resume.py)."""
        self.flush()
        self._retrying("log_artifacts", self.client.log_artifacts, self.run_id, str(local_dir), artifact_path)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self._retrying("log_dict", self.client.log_dict, self.run_id, obj, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._retrying("log_text", self.client.log_text, self.run_id, text, artifact_file)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        import pandas as pd

        self._retrying("log_table", mlflow.log_table, pd.DataFrame(rows), artifact_file=artifact_file,
                       run_id=self.run_id)

    def finish(self, status: str = "FINISHED") -> None:
        self._retrying("set_terminated", self.client.set_terminated, self.run_id, status)


def register(run: StageRun, artifact_path: str, tags: dict[str, str]) -> str:
    """Register `<run artifacts>/<artifact_path>` as a new version of the stage's model; returns `models:/n/v`."""
    name = MODEL_NAMES[run.stage]
    client = run.client
    try:
        client.create_registered_model(name, description=f"rlhf-pipeline {run.stage} models")
    except mlflow.exceptions.MlflowException:
        pass  # exists
    source = f"{run.artifact_uri}/{artifact_path}"
    # Idempotent: a retried publish must not register the same run's artifacts twice.
    for mv in client.search_model_versions(f"name = '{name}' and run_id = '{run.run_id}'"):
        if mv.source == source:
            return f"models:/{name}/{mv.version}"
    mv = client.create_model_version(name, source=source, run_id=run.run_id, tags={k: str(v) for k, v in tags.items()})
    return f"models:/{name}/{mv.version}"


def download(uri: str) -> Path:
    """Local path of an artifact or `models:/` URI. For a local store this is the stored files themselves (no
    copy): callers only read it."""
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except mlflow.exceptions.MlflowException as e:
        raise FileNotFoundError(f"cannot load artifact {uri}: {e.message}") from None


def manifest_digest(files: dict[str, str]) -> str:
    """The content identity of an artifact directory: sha256 over its manifest (relative path -> file sha256)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_manifest(local_dir: Path) -> str:
    """Write `manifest.json` (sha256 of each file) into `local_dir`; return the digest of the whole dir."""
    files = {str(p.relative_to(local_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (local_dir / "manifest.json").write_text(json.dumps(files, indent=1, sort_keys=True))
    return manifest_digest(files)


def verify_manifest(local_dir: Path, digest: str) -> bool:
    """True when every file listed in the manifest is present and intact, and the manifest matches `digest`."""
    try:
        files = json.loads((local_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest_digest(files) != digest:
        return False
    for rel, sha in files.items():
        p = local_dir / rel
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != sha:
            return False
    return True


def model_version(uri: str):
    """The registry entry behind `models:/name/version` or `models:/name@alias`, or a clear error naming it."""
    ref = uri.removeprefix("models:/")
    name, sep, alias = ref.partition("@")
    client = MlflowClient()
    try:
        if sep:
            return client.get_model_version_by_alias(name, alias)
        name, _, version = ref.partition("/")
        if version == "latest":
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise FileNotFoundError(f"no registered model {uri}: {name} has no versions")
            return max(versions, key=lambda mv: int(mv.version))
        return client.get_model_version(name, version)
    except mlflow.exceptions.MlflowException as e:
        raise FileNotFoundError(f"no registered model {uri}: {e.message}") from None
