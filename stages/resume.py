"""Exact resume of an interrupted PPO stage.

A PPO run that was killed (SIGKILL, OOM, a lost machine) stays RUNNING in MLflow with its checkpoints logged. The
next PPO stage with the same cache key finds it, loads its newest checkpoint into the freshly built trainer
(weights, optimizer, RNG states, prompt sampler, KL controller, iteration), copies the metric history up to that
iteration into the new run, and marks the old run FAILED with a pointer to its successor. Continuing from there
gives, on CPU with the same seed, exactly the metrics of an uninterrupted run.

The per-key lock of `run_cached` guarantees no live process is still working on a run found here. The stage finds
and downloads the checkpoints (`resumable`); the loop loads the newest that loads cleanly, in this process or in every
launched one (`rlhf_lib.ppo.loop.train_ppo`), and reports it with a `Resumed` event, on which the stage's sink calls
`resumed`. A checkpoint does not record how many processes wrote it.
"""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.entities import Metric

from rlhf_lib.ppo.checkpoint import is_complete
from stages.tracking import RetryingClient, StageRun, download, newest_runs


def unfinished_run(experiment_id: str, key: str, exclude: str) -> str | None:
    """The newest earlier PPO run with this cache key that was interrupted: killed (left RUNNING) or stopped by
    Ctrl-C (tagged `rlhf.interrupted`). A run that failed on an error is not resumed: it would fail again."""
    runs = newest_runs(experiment_id, "ppo",
                       f"tags.`rlhf.cache_key_pending` = '{key}' and attributes.status != 'FINISHED'")
    interrupted = [r for r in runs if r.info.status == "RUNNING" or r.data.tags.get("rlhf.interrupted") == "true"]
    return next((r.info.run_id for r in interrupted if r.info.run_id != exclude), None)


def resumable(run: StageRun, key: str) -> tuple[str, list[Path]] | None:
    """The interrupted run with `key` and its fully logged checkpoints (they have the marker), newest first,
    downloaded; None when there is none. A run without such a checkpoint is retired here."""
    old = unfinished_run(run.run.info.experiment_id, key, exclude=run.run_id)
    if old is None:
        return None
    client = RetryingClient()
    if not [f for f in client.list_artifacts(old, "checkpoints")]:
        _retire(client, old, run.run_id, "no checkpoint to resume from")
        return None
    root = download(f"runs:/{old}/checkpoints")
    found = [c for c in sorted(root.glob("iter_*"), reverse=True) if is_complete(c)]
    if not found:
        _retire(client, old, run.run_id, "no complete checkpoint to resume from")
        return None
    return old, found


def resumed(run: StageRun, old: str | None, checkpoint: str | None, iteration: int) -> None:
    """After loading checkpoint `checkpoint` of run `old` (None: none of them loaded): copy the metric history up
    to `iteration` into `run`, tag it, and retire `old`."""
    if old is None:
        return
    client = RetryingClient()
    if checkpoint is None:
        _retire(client, old, run.run_id, "no complete checkpoint to resume from")
        return
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
