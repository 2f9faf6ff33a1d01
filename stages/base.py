"""The cached-stage runner every stage goes through: look up the key, else run, log, register, then mark done.

Order matters for "nothing half-written is registered or cached": the artifacts are logged first, then the
model version is registered, and only then does the run get its `rlhf.cache_key` tag and the FINISHED status
that `lookup` requires. A stage that raises ends FAILED, without the tag, and is never a cache hit. Once published,
the stage's output dir moves into the local artifact cache (`stages.artifact_cache.adopt`), so the stages downstream
read it without downloading what was just uploaded.

Across machines (`resources.num_machines` > 1) node 0 does all of the above; another node follows it
(`stages.follower`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import DatasetInput, InputTag
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.states import Completed

from rlhf_lib.events import Event, Metrics, Notice, Table, Tags
from stages import artifact_cache, progress
from stages.cache import StageResult, cache_key, lookup
from stages.context import RunContext
from stages.follower import FollowerRun, follow
from stages.home import file_lock
from stages.manifest import write_manifest
from stages.peak_rss import PeakRSS, release_freed_memory
from stages.tracking import (
    MODEL_NAMES,
    RetryingClient,
    StageRun,
    register,
    store_call,
)

VARIANT_TAG = "rlhf.variant"  # a control arm's run: logged and cached, never registered
ARTIFACT_DIR = {"data": "data", "sft": "model", "reward": "model", "ppo": "model", "eval": "report", "dpo": "model"}


def warn(message: str) -> None:
    """`message` as a warning of the Prefect run the stage builds in (its UI shows it), or of the `rlhf` logger
    outside one (a stage built by `rlhf run` on a follower node)."""
    try:
        get_run_logger().warning(message)
    except MissingContextError:
        logging.getLogger("rlhf").warning(message)


class RunSink:
    """The sink of a stage's training loop (`rlhf_lib.events`): metrics, tables and tags to the stage's MLflow run,
    notices to Prefect's log (the terminal and the UI), and with `total` steps the loop's progress
    (`stages.progress`)."""

    def __init__(self, run: StageRun, total: int | None = None):
        self.run, self.total = run, total

    def emit(self, event: Event) -> None:
        match event:
            case Metrics(values, step):
                self.run.log_metrics(values, step=step)
                if self.total:
                    progress.report(self.run.stage, step + 1, self.total, values)
            case Table(rows, path):
                self.run.log_table(rows, path, wait=False)
            case Tags(tags):
                self.run.set_tags(tags, wait=False)
            case Notice(message):
                get_run_logger().warning(message)
            case _:
                raise TypeError(f"{type(self).__name__} cannot take a {type(event).__name__} event")


# A build function fills `out_dir` with the stage's artifacts, logging metrics to `run` as it goes.
BuildFn = Callable[[StageRun, Path], None]


def run_cached(
    ctx: RunContext,
    stage: str,
    section: dict[str, Any],
    upstream: dict[str, StageResult],
    data_fingerprint: str,
    build: BuildFn,
    fetch: bool = False,
    variant: str | None = None,
) -> tuple[StageResult, Path | None]:
    """Return the stage's result and, with `fetch`, the local path of its artifacts: from the cache or by running
    `build`. Without `fetch` a cache hit downloads nothing (the stages downstream fetch what they read).
    `variant` (a control arm of PPO, e.g. `zero_reward`): the run is named `<stage>-<variant>-<key>` and tagged
    `rlhf.variant`, and its model is logged and kept but never registered (no `rlhf-policy` version, no champion).

    The look-up and the run happen under a lock on the cache key, so two pipelines started together do not both
    train and register the same stage: the second waits, then finds the first one's result.
    """
    logger = get_run_logger()
    t0 = time.perf_counter()
    key = cache_key(stage, section, {k: v.digest for k, v in upstream.items()}, data_fingerprint)
    with key_lock(stage, key):
        if stage not in ctx.force:
            hit = lookup_task(ctx.experiment_id, stage, key, fetch)
            if hit is not None:
                result, local = hit
                result.seconds = time.perf_counter() - t0
                if ctx.parent_run_id:
                    RetryingClient().set_tag(ctx.parent_run_id, f"rlhf.cache_hit.{stage}{'-' + variant if variant else ''}", "true")
                logger.info("%s: cache hit %s (run %s)", stage, key, result.mlflow_run_id)
                return result, local
        if ctx.machine_rank > 0:
            result = follow(ctx, stage, key, build)
        else:
            result = _run(ctx, stage, key, section, upstream, data_fingerprint, build, variant)
    result.seconds = time.perf_counter() - t0
    return result, artifact_cache.download(result.artifact_uri, result.digest) if fetch else None


def _run(ctx: RunContext, stage: str, key: str, section: dict[str, Any], upstream: dict[str, StageResult],
         data_fingerprint: str, build: BuildFn, variant: str | None = None) -> StageResult:
    lineage = {f"rlhf.upstream.{k}": v.model_uri or v.mlflow_run_id for k, v in upstream.items()}
    config_hash = hashlib.sha256(json.dumps(section, sort_keys=True, default=str).encode()).hexdigest()[:16]
    lineage.update({"rlhf.data_fingerprint": data_fingerprint, "rlhf.config_hash": config_hash, "rlhf.cache_key": key})
    name = f"{stage}-{variant}-{key[:8]}" if variant else f"{stage}-{key[:8]}"
    run = StageRun(ctx.experiment_id, stage, ctx.parent_run_id, name,
                   lineage_tags(lineage) | ({VARIANT_TAG: variant} if variant else {}))
    get_run_logger().info("%s: running (cache key %s, MLflow run %s)", stage, key, run.run_id)
    try:
        # In the cache's staging dir, so that keeping the published output (`adopt`) is a rename.
        with tempfile.TemporaryDirectory(prefix=artifact_cache.staging_prefix(stage), dir=artifact_cache.staging()) as tmp:
            out_dir = Path(tmp) / ARTIFACT_DIR[stage]
            out_dir.mkdir()
            run.log_params(flatten(section))  # under their config keys: `ppo.lr`, `model.n_positions`
            t_build = time.perf_counter()
            release_freed_memory()
            with PeakRSS() as peak:
                build(run, out_dir)
            run.log_metrics({"system/peak_rss_gb": peak.bytes / 2**30, "system/start_rss_gb": peak.start / 2**30,
                             "system/build_seconds": time.perf_counter() - t_build}, step=0)
            run.flush()  # every metric is in the store before the stage can count as done
            digest = write_manifest(out_dir)
            model_uri = publish_task(run, out_dir, lineage, digest, register_model=variant is None)
            artifact_cache.adopt(out_dir, f"{run.artifact_uri}/{ARTIFACT_DIR[stage]}")
    except BaseException as e:
        run.send_pending()  # one try: a failed run still shows its last metrics (the NaN, the alarm) if the store is up
        if isinstance(e, KeyboardInterrupt):
            run.set_tags({"rlhf.interrupted": "true"})  # resumable, unlike a failure (see stages/resume.py)
        unregister(run)
        run.finish("FAILED")
        raise
    if ctx.parent_run_id:
        RetryingClient().set_tag(ctx.parent_run_id, f"rlhf.cache_hit.{stage}{'-' + variant if variant else ''}", "false")
    return StageResult(stage=stage, status="ran", cache_key=key, mlflow_run_id=run.run_id,
                       artifact_uri=f"{run.artifact_uri}/{ARTIFACT_DIR[stage]}", digest=digest, model_uri=model_uri)


# I/O tasks: MLflow calls, each retried by the one policy of `stages.retry` (a transient store error must not cost a
# trained model); Prefect does not retry them again. Training itself is never retried.
_IO = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="lookup-cache", **_IO)
def lookup_task(experiment_id: str, stage: str, key: str, fetch: bool = False) -> tuple[StageResult, Path | None] | None:
    return lookup(experiment_id, stage, key, fetch)


@task(name="publish", **_IO)
def publish_task(run: StageRun, out_dir: Path, lineage: dict[str, str], digest: str,
                 register_model: bool = True) -> str | None:
    """Log the artifacts, register the model (unless `register_model` is off: a control arm), then mark the run
    complete: only now is it a cache hit. Idempotent
    under retries: the same files, at most one version per run (see `register`), the same tags. A kill between the
    registration and the run's end leaves a version of a RUNNING run: the next run on the machine deletes it and
    marks the run FAILED (`stages.reaper`)."""
    run.log_dir(out_dir, ARTIFACT_DIR[run.stage])
    model_uri = None
    if run.stage in MODEL_NAMES and register_model:
        model_uri = store_call("register", register, run, ARTIFACT_DIR[run.stage], {**lineage, "rlhf.digest": digest})
    run.set_tags({"rlhf.digest": digest, "rlhf.artifact_uri": f"{run.artifact_uri}/{ARTIFACT_DIR[run.stage]}",
                  "rlhf.model_uri": model_uri or "", "rlhf.cache_key": lineage["rlhf.cache_key"]})
    run.finish("FINISHED")
    return model_uri


def unregister(run: StageRun) -> None:
    """Delete any model version this failed run registered before failing: nothing half-done stays in the registry."""
    if run.stage not in MODEL_NAMES:
        return
    name = MODEL_NAMES[run.stage]
    try:
        for mv in run.client.search_model_versions(f"name = '{name}' and run_id = '{run.run_id}'"):
            run.client.delete_model_version(name, mv.version)
    except mlflow.exceptions.MlflowException:
        pass  # the registry is unreachable too; the run's FAILED status already keeps it out of the cache


def key_lock(stage: str, key: str):
    """An exclusive lock per (stage, cache key): processes on this machine sharing the state dir take turns."""
    return file_lock(f"{stage}-{key}")


def as_state(result: StageResult, value: Any = None) -> Any:
    """What a stage sub-flow returns: on a cache hit a Prefect `Cached` (Completed) state, so the UI shows it."""
    data = result if value is None else value
    if result.status == "cached":
        return Completed(data=data, name="Cached", message=f"cache hit {result.cache_key}")
    return data


def lineage_tags(lineage: dict[str, str]) -> dict[str, str]:
    # The key is only set as `rlhf.cache_key` once the stage is complete; until then it is "pending".
    return {("rlhf.cache_key_pending" if k == "rlhf.cache_key" else k): v for k, v in lineage.items()}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def log_dataset(run: StageRun | FollowerRun, rows: list[dict], source: str, name: str, context: str,
                digest: str) -> None:
    """Record a data set as an input of `run` (MLflow's Datasets panel), with its source and digest."""
    if isinstance(run, FollowerRun):
        return
    with warnings.catch_warnings():  # a file:// source matches two equivalent source classes; either is right
        warnings.simplefilter("ignore", UserWarning)
        ds = mlflow.data.from_pandas(pd.DataFrame(rows), source=_dataset_source(source), name=name,
                                     digest=digest[:36])
    tags = [InputTag("mlflow.data.context", context)]
    store_call("log_inputs", run.client.log_inputs, run.run_id, [DatasetInput(ds._to_mlflow_entity(), tags)])


def _dataset_source(uri: str):
    """A source MLflow can record. A server that proxies artifacts hands out `mlflow-artifacts:/...` URIs, which no
    dataset-source class resolves; the same file is served over HTTP by the tracking server, so record that URL."""
    if not uri.startswith("mlflow-artifacts:"):
        return uri
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    path = uri.split(":", 1)[1].lstrip("/")
    return HTTPDatasetSource(f"{mlflow.get_tracking_uri().rstrip('/')}/api/2.0/mlflow-artifacts/artifacts/{path}")
