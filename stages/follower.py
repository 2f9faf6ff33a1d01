"""A stage on a node with machine_rank > 0 (a "follower"): it looks up the cache as node 0 does; on a miss it runs a
training stage's build with a `FollowerRun` that logs nothing, up to the launch it shares with node 0
(`stages.rendezvous`), then takes node 0's finished run from the store. It creates no run and registers nothing, so
it can leave nothing half-written. The runner that calls it is `stages.base.run_cached`."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from stages.cache import StageResult, lookup
from stages.context import RunContext
from stages.rendezvous import FollowerDone
from stages.tracking import StageRun, newest_runs, tracking_uri

# A build function fills `out_dir` with the stage's artifacts, logging metrics to `run` as it goes.
BuildFn = Callable[[Any, Path], None]


class FollowerRun:
    """What a stage's build logs to on a node with machine_rank > 0: nothing. Node 0 alone logs, registers and caches,
    so the build runs unchanged up to its launch (`stages.rendezvous.FollowerDone`) and whatever it logs on the way
    is dropped here."""

    def __init__(self, stage: str, key: str):
        self.stage, self.key = stage, key
        self.run_id, self.artifact_uri = "", ""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def set_tags(self, tags: dict[str, Any], wait: bool = True) -> None:
        pass

    def log_table(self, rows: list[dict], artifact_file: str, wait: bool = True) -> None:
        pass

    def log_dir(self, local_dir: Path, artifact_path: str, wait: bool = True) -> None:
        pass


def launch_id_of(run: StageRun | FollowerRun) -> str:
    """What the nodes of a multi-node stage meet for (`stages.rendezvous`): the stage and its cache key, the same on
    every node that runs this stage on the same inputs."""
    return f"{run.stage}-{pending_key(run)}"


def pending_key(run: StageRun | FollowerRun) -> str:
    """The cache key of the stage a run is building."""
    return run.key if isinstance(run, FollowerRun) else run.run.data.tags["rlhf.cache_key_pending"]


# Stages whose build trains across nodes: a follower runs it up to its launch. The others are node 0's alone.
TRAINED_ACROSS_NODES = ("sft", "reward", "ppo")
# A node 0 killed while publishing leaves its run RUNNING for ever; a follower waits on it at most this long (an
# upload of a large model), and `rdzv_timeout_s` for a run that does not show up at all.
PUBLISH_LIMIT_S = 3600.0
FOLLOW_POLL_S = 1.0  # a search and a look-up per poll: cheap for the store at this pace


def follow(ctx: RunContext, stage: str, key: str, build: BuildFn) -> StageResult:
    """A stage on a node with machine_rank > 0: train alongside node 0 where the stage trains (its build, up to the
    launch, logging nothing: `FollowerRun`), then take node 0's result from MLflow once its run with this key has
    finished. Creates no run, registers nothing, writes no cache: a follower has nothing to leave half-written."""
    earlier = lookup(ctx.experiment_id, stage, key)  # a forced rerun: node 0's new run is the answer, not this
    failed = {r.info.run_id for r in _runs_of(ctx, stage, key) if r.info.status == "FAILED"}
    if stage in TRAINED_ACROSS_NODES:
        get_run_logger().info("%s: training with node 0 as machine_rank %d (cache key %s)", stage,
                              ctx.machine_rank, key)
        with tempfile.TemporaryDirectory(prefix=f"rlhf-{stage}-follower-") as tmp:
            try:
                build(FollowerRun(stage, key), Path(tmp))
            except FollowerDone:
                pass
            else:
                raise RuntimeError(f"{stage}: the build ended on machine_rank {ctx.machine_rank} without a launch "
                                   "across nodes; only node 0 builds this stage")
    result = _await_node0(ctx, stage, key, earlier[0].mlflow_run_id if earlier else None, failed)
    result.status = "ran" if stage in TRAINED_ACROSS_NODES else "cached"  # "ran": this node trained too
    return result


def _runs_of(ctx: RunContext, stage: str, key: str) -> list:
    return newest_runs(ctx.experiment_id, stage, f"tags.`rlhf.cache_key_pending` = '{key}'")


def _await_node0(ctx: RunContext, stage: str, key: str, earlier: str | None, failed: set[str]) -> StageResult:
    """Poll the store until node 0's finished run with `key` (not `earlier`) appears. Fails at once when node 0's run
    fails, and after `rdzv_timeout_s` without one; while node 0's run is RUNNING (publishing) up to
    `PUBLISH_LIMIT_S`."""
    start = time.monotonic()
    deadline = start + ctx.rdzv_timeout_s
    while True:
        hit = lookup(ctx.experiment_id, stage, key)
        if hit is not None and hit[0].mlflow_run_id != earlier:
            return hit[0]
        runs = _runs_of(ctx, stage, key)
        if bad := [r.info.run_id for r in runs if r.info.status == "FAILED" and r.info.run_id not in failed]:
            raise RuntimeError(f"{stage}: node 0's run {bad[0]} with cache key {key} failed; machine_rank "
                               f"{ctx.machine_rank} has no result to take (see that run, or node 0's log)")
        now = time.monotonic()
        if runs and runs[0].info.status == "RUNNING":
            deadline = max(deadline, min(start + PUBLISH_LIMIT_S, now + ctx.rdzv_timeout_s))
        if now > deadline:
            raise TimeoutError(
                f"{stage}: no finished run with cache key {key} from node 0 in the MLflow store {tracking_uri()} "
                f"after {now - start:.0f} s (machine_rank {ctx.machine_rank}, resources.rdzv_timeout_s "
                f"{ctx.rdzv_timeout_s:g}): do all nodes share one tracking store and run the same config?")
        time.sleep(FOLLOW_POLL_S)
