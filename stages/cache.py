"""Stage cache keys and lookups.

A stage's key covers (docs/architecture.md, "What a cache key covers"): its own config section, the identities of
its upstream artifacts (content digests), the fingerprint of its input data, and a hash of the source of the code it
runs: every project module its stage module imports, directly or not (`stages.code_deps`). A hit needs a FINISHED
MLflow run carrying that key whose artifacts are still there: its manifest matches the digest recorded at log
time and lists no file the store lacks, so a deleted artifact is a miss, never a stale hit. A look-up reads tags,
the manifest and a listing, never the model files: those are downloaded (once per machine, checked against the
digest) only by a stage that runs on them (`stages.artifact_cache`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from stages.artifact_cache import download, intact, resolve
from stages.code_deps import ROOT, source_files
from stages.manifest import content_digest, read_manifest, verify_manifest
from stages.net import ArtifactNotFound
from stages.tracking import RetryingClient, model_version, newest_runs

# Numerics also depend on these libraries' versions (datasets parses the user's CSV, JSON and Parquet files).
_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "datasets")


class StageResult(BaseModel):
    """What a stage hands downstream: small, JSON-able identities, never tensors or models."""

    stage: str
    status: Literal["ran", "cached"]
    cache_key: str
    mlflow_run_id: str
    artifact_uri: str
    digest: str
    model_uri: str | None = None
    seconds: float = 0.0
    source: str | None = None  # set when the user named the artifact (e.g. --reward-model models:/rlhf-reward/3)

    def summary(self) -> dict[str, Any]:
        out = {"status": self.status, "cache_key": self.cache_key, "mlflow_run_id": self.mlflow_run_id,
               "seconds": round(self.seconds, 2)}
        if self.model_uri:
            out["model_uri"] = self.model_uri
        if self.source:
            out["source"] = self.source
        return out


@cache
def code_version(stage: str) -> str:
    """sha256 of the source of every project module the stage's module imports, directly or not (paths relative to
    the project, then bytes; `stages.code_deps`), and of the library versions."""
    h = hashlib.sha256()
    for f in source_files(stage_module(stage)):
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(f.read_bytes())
    h.update(_library_versions().encode())
    return h.hexdigest()[:16]


def stage_module(stage: str) -> str:
    """The module that defines a stage: `stages.<stage>`."""
    return f"stages.{stage}"


@cache
def _library_versions() -> str:
    return ",".join(f"{lib}=={importlib.metadata.version(lib)}" for lib in _LIBRARIES)


def cache_key(stage: str, section: dict[str, Any], upstream: dict[str, str], data_fingerprint: str) -> str:
    """The content key of a stage run. `upstream` maps upstream stage -> artifact digest."""
    payload = {"stage": stage, "config": section, "upstream": upstream, "data": data_fingerprint,
               "code": code_version(stage)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def lookup(experiment_id: str, stage: str, key: str, fetch: bool = False) -> tuple[StageResult, Path | None] | None:
    """The newest intact finished run of `stage` with `key`, and with `fetch` the local path of its artifacts."""
    runs = newest_runs(experiment_id, stage, f"tags.`rlhf.cache_key` = '{key}' and attributes.status = 'FINISHED'")
    for run in runs:
        tags = run.data.tags
        uri, digest = tags.get("rlhf.artifact_uri"), tags.get("rlhf.digest")
        if not uri or not digest:
            continue
        try:
            local = download(uri, digest) if fetch else None  # first: then its manifest is read from the copy
        except ArtifactNotFound:
            continue
        if not intact(uri, digest):
            continue
        return (
            StageResult(stage=stage, status="cached", cache_key=key, mlflow_run_id=run.info.run_id,
                        artifact_uri=uri, digest=digest, model_uri=tags.get("rlhf.model_uri") or None),
            local,
        )
    return None


def given_model(stage: str, uri: str) -> StageResult:
    """A stage result for a model the user named instead of the cached stage (`models:/rlhf-reward/3`,
    `models:/rlhf-reward@champion`, `runs:/<id>/model`, or any artifact URI). Its identity is the digest of its
    files, so downstream cache keys follow the model, not the name: the digest recorded when it was logged (the
    version's or run's `rlhf.digest` tag), computed from a download only for a model this pipeline did not log. It
    counts as `cached`: nothing was trained."""
    run_id, source, tags = "", uri, {}
    if uri.startswith("models:/"):
        mv = model_version(uri)  # a missing version or alias is named here, before anything is downloaded
        uri, run_id, tags = f"models:/{mv.name}/{mv.version}", mv.run_id or "", mv.tags
        location = resolve(mv.source)
    else:
        location = resolve(uri)
        if uri.startswith("runs:/"):
            run_id = uri.removeprefix("runs:/").split("/")[0]
            run_tags = RetryingClient().get_run(run_id).data.tags
            tags = run_tags if run_tags.get("rlhf.artifact_uri") == location else {}
    digest = tags.get("rlhf.digest")
    if digest is None:  # not logged by this pipeline: its files are its identity
        local = download(location)
        digest = content_digest(local)
        if read_manifest(local) is not None and not verify_manifest(local, digest):
            raise ArtifactNotFound(f"{source}: files do not match its manifest.json (corrupted or partly deleted)")
    elif not intact(location, digest):
        raise ArtifactNotFound(f"{source}: files do not match its manifest.json (corrupted or partly deleted)")
    return StageResult(stage=stage, status="cached", cache_key="", mlflow_run_id=run_id, artifact_uri=location,
                       digest=digest, model_uri=uri if uri.startswith("models:/") else None, source=source)
