"""Stage cache keys and lookups.

A stage's key covers (DESIGN section 1): its own config section, the identities of its upstream artifacts
(content digests), the fingerprint of its input data, and a hash of the source of the code it runs. A hit needs a
FINISHED MLflow run carrying that key whose artifacts are still there and intact: a deleted or corrupted
artifact is a miss, never a stale hit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

import mlflow
from pydantic import BaseModel

from stages.tracking import dir_digest, download, manifest_digest, verify_manifest

# The modules whose source each stage's output depends on (a package means all its modules). Over-listing only
# costs a rerun; under-listing would reuse a stale artifact, so when in doubt a module is listed.
_TRAIN = ["rlhf_lib.models", "rlhf_lib.data", "rlhf_lib.training", "rlhf_lib.distributed", "stages.models_io",
          "stages.launch"]
STAGE_CODE: dict[str, list[str]] = {
    "data": ["rlhf_lib.demo_task", "rlhf_lib.data", "rlhf_lib.models", "stages.data", "stages.models_io"],
    "sft": ["rlhf_lib.sft", *_TRAIN, "stages.sft"],
    "reward": ["rlhf_lib.reward", *_TRAIN, "rlhf_lib.ppo.scoring", "rlhf_lib.ppo.losses", "rlhf_lib.ppo.masked",
               "stages.reward"],
    "ppo": ["rlhf_lib.ppo", *_TRAIN, "stages.ppo", "stages.ppo_loop", "stages.resume"],
    "eval": ["rlhf_lib.eval", "rlhf_lib.ppo", "rlhf_lib.reward", "rlhf_lib.demo_task", *_TRAIN, "stages.eval",
             "stages.report"],
}
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


def _module_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"cannot locate module {module} to hash its code")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every .py under it
        return sorted(origin.parent.rglob("*.py"))
    return [origin]


@cache
def code_version(stage: str) -> str:
    """sha256 of the source files the stage runs (paths relative to the project) and of the library versions."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    files = sorted({f.resolve() for m in STAGE_CODE[stage] for f in _module_files(m)})
    for f in files:
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes())
    h.update(_library_versions().encode())
    return h.hexdigest()[:16]


@cache
def _library_versions() -> str:
    return ",".join(f"{lib}=={importlib.metadata.version(lib)}" for lib in _LIBRARIES)


def cache_key(stage: str, section: dict[str, Any], upstream: dict[str, str], data_fingerprint: str) -> str:
    """The content key of a stage run. `upstream` maps upstream stage -> artifact digest."""
    payload = {"stage": stage, "config": section, "upstream": upstream, "data": data_fingerprint,
               "code": code_version(stage)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def lookup(experiment_id: str, stage: str, key: str) -> tuple[StageResult, Path] | None:
    """The newest intact finished run of `stage` with `key`, and the local path of its artifacts."""
    runs = mlflow.search_runs(
        [experiment_id],
        filter_string=f"tags.`rlhf.stage` = '{stage}' and tags.`rlhf.cache_key` = '{key}' "
        "and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
        max_results=5,
    )
    for run in runs:
        tags = run.data.tags
        uri, digest = tags.get("rlhf.artifact_uri"), tags.get("rlhf.digest")
        if not uri or not digest:
            continue
        try:
            local = download(uri)
        except FileNotFoundError:
            continue
        if not verify_manifest(local, digest):
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
    files, so downstream cache keys follow the model, not the name. It counts as `cached`: nothing was trained."""
    local = download(uri)
    manifest = local / "manifest.json"
    if manifest.is_file():
        files = json.loads(manifest.read_text())
        digest = manifest_digest(files)
        if not verify_manifest(local, digest):
            raise ValueError(f"{uri}: files do not match its manifest.json (corrupted or partly deleted)")
    else:
        digest = dir_digest(local)
    run_id = ""
    if uri.startswith("models:/"):
        from stages.tracking import model_version

        mv = model_version(uri)
        uri, run_id = f"models:/{mv.name}/{mv.version}", mv.run_id or ""
    elif uri.startswith("runs:/"):
        run_id = uri.removeprefix("runs:/").split("/")[0]
    return StageResult(stage=stage, status="cached", cache_key="", mlflow_run_id=run_id, artifact_uri=str(local),
                       digest=digest, model_uri=uri if uri.startswith("models:/") else None, source=uri)
