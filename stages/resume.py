"""Exact resume of an interrupted PPO stage.

A PPO run that was killed (SIGKILL, OOM, a lost machine) stays RUNNING in MLflow with its checkpoints logged. The
next PPO stage with the same cache key finds it, loads its newest checkpoint into the freshly built trainer
(weights, optimizer, RNG states, prompt sampler, KL controller, iteration), copies the metric history up to that
iteration into the new run, and marks the old run FAILED with a pointer to its successor. Continuing from there
gives, on CPU with the same seed, exactly the metrics of an uninterrupted run.

The per-key lock of `run_cached` guarantees no live process is still working on a run found here. The stage finds
the run's complete checkpoints by listing them (`resumable`) and downloads one at a time, newest first (`attempts`):
the loop loads it, in this process or in every launched one (`rlhf_lib.ppo.loop.train_ppo`), and reports it with a
`Resumed` event, on which the stage's sink calls `resumed`; only when it does not load is the one before it
downloaded (the sink raises `CheckpointRejected` and the stage starts the loop again). A checkpoint does not record
how many processes wrote it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric

from rlhf_lib.ppo.checkpoint import COMPLETE_MARKER, is_complete
from stages import artifact_cache
from stages.net import ArtifactNotFound
from stages.tracking import RetryingClient, StageRun, newest_runs

_log = logging.getLogger(__name__)


class CheckpointRejected(Exception):
    """The checkpoint the loop was given did not load: the stage tries the one before it."""


@dataclass
class Resume:
    """An interrupted run and its checkpoints that were logged completely (marker present), newest first: names,
    downloaded only when tried (`attempts`)."""

    run_id: str
    artifact_uri: str
    checkpoints: list[str]
    downloaded: list[str] = field(default_factory=list)

    def location(self, name: str) -> str:
        return f"{self.artifact_uri}/checkpoints/{name}"


def unfinished_run(experiment_id: str, key: str, exclude: str) -> str | None:
    """The newest earlier PPO run with this cache key that was interrupted and not yet taken over: killed (left
    RUNNING, or marked FAILED by `stages.reaper`) or stopped by Ctrl-C (both tagged `rlhf.interrupted`). A run that failed on an error is not resumed: it would fail again."""
    runs = newest_runs(experiment_id, "ppo",
                       f"tags.`rlhf.cache_key_pending` = '{key}' and attributes.status != 'FINISHED'")
    interrupted = [r for r in runs if (r.info.status == "RUNNING" or r.data.tags.get("rlhf.interrupted") == "true")
                   and not r.data.tags.get("rlhf.resumed_by")]
    return next((r.info.run_id for r in interrupted if r.info.run_id != exclude), None)


def resumable(run: StageRun, key: str) -> Resume | None:
    """The interrupted run with `key` and its complete checkpoints, found by listing (nothing is downloaded); None
    when there is none. A run without such a checkpoint is retired here."""
    old = unfinished_run(run.run.info.experiment_id, key, exclude=run.run_id)
    if old is None:
        return None
    client = RetryingClient()
    names = sorted((f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(old, "checkpoints") if f.is_dir),
                   reverse=True)  # iter_NNNNNN: newest first
    complete = [n for n in names if f"checkpoints/{n}/{COMPLETE_MARKER}"
                in {f.path for f in client.list_artifacts(old, f"checkpoints/{n}")}]
    if not complete:
        _retire(client, old, run.run_id, "no complete checkpoint to resume from")
        return None
    return Resume(old, client.get_run(old).info.artifact_uri, complete)


def attempts(run: StageRun, found: Resume | None) -> Iterator[Path | None]:
    """What the loop resumes from, one at a time: each complete checkpoint of `found`, newest first, each downloaded
    only when the caller asks for the next (the one before failed to load); a download that fails or lacks its marker
    is skipped. Last (or only, without `found`) None: start afresh, the interrupted run retired."""
    if found is not None:
        for name in found.checkpoints:
            found.downloaded.append(found.location(name))
            try:
                path = artifact_cache.download_own(found.location(name), check=is_complete)
            except ArtifactNotFound as e:
                _log.warning("ppo: checkpoint %s of run %s could not be downloaded: %s", name, found.run_id, e)
                continue
            yield path
        _retire(RetryingClient(), found.run_id, run.run_id, "no checkpoint loaded")
    yield None


def forget(found: Resume | None) -> None:
    """Drop the downloaded checkpoints of a retired run from the artifact cache: nothing reads them again."""
    for location in found.downloaded if found else []:
        artifact_cache.evict(location)


def resumed(run: StageRun, old: str, checkpoint: str, iteration: int) -> None:
    """After loading checkpoint `checkpoint` of run `old`: copy the metric history up to `iteration` into `run`, tag
    it, and retire `old`."""
    client = RetryingClient()
    _copy_history(client, old, run.run_id, before=iteration)
    run.set_tags({"rlhf.resumed_from": f"{old}/checkpoints/{checkpoint}"})
    _retire(client, old, run.run_id, f"resumed from {checkpoint}")


def _retire(client: RetryingClient, old: str, new: str, why: str) -> None:
    """Mark the interrupted run (and its pipeline's parent run, if still RUNNING) FAILED, never RUNNING forever."""
    client.set_tag(old, "rlhf.resumed_by", f"{new} ({why})")
    parent = client.get_run(old).data.tags.get("mlflow.parentRunId")
    for run_id in (old, parent):
        if run_id and client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "FAILED")


def _copy_history(client: RetryingClient, old: str, new: str, before: int) -> None:
    """The old run's per-iteration metrics for steps < `before`, so the new run shows the whole curve."""
    ts = int(time.time() * 1000)
    batch = [
        Metric(key, m.value, ts, m.step)
        for key in client.get_run(old).data.metrics
        for m in client.get_metric_history(old, key)
        if m.step < before
    ]
    for i in range(0, len(batch), 900):
        client.log_batch(new, metrics=batch[i : i + 900])
