"""Stages on Prefect work pools (`resources.work_pools`): the `rlhf` flow sends such a stage to its deployment
`rlhf/<stage>` on that pool and waits for it.

The flow run it starts is the same `rlhf` flow with `pipeline=<stage>` and `local_only=True` (so it runs every stage
in its own process, never sending one on again), the whole config, and the SFT and reward models this run already
has pinned by URI: the worker reads them from MLflow, and its cache keys are the ones this process would compute.
It writes to this run's MLflow store (the `MLFLOW_TRACKING_URI` job variable) and logs its summary as
`summary.json` on its MLflow parent run, from which the stage's identities are read back here: artifacts travel
through MLflow, never through a shared disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from uuid import UUID

from prefect import get_run_logger

from rlhf_lib.config import PipelineConfig
from stages.cache import StageResult
from stages.tracking import EXPERIMENT, RetryingClient, store_call, tracking_uri

POLL_S = 2.0
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


class PlacementError(RuntimeError):
    """A stage could not run on its work pool: no deployment there, no worker, or its flow run did not complete."""


@dataclass
class Dispatched:
    """A stage that ran on a work pool: its result, the eval metrics when it is the eval stage, and its flow run."""

    result: StageResult
    metrics: dict | None
    flow_run_id: str
    pool: str


def check_deployment(stage: str, pool: str) -> None:
    """The deployment `rlhf/<stage>` exists on the Prefect API and takes its runs from `pool`."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    name = f"rlhf/{stage}"
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise PlacementError(
                f"resources.work_pools.{stage}={pool!r}: no deployment {name} on the Prefect API "
                f"{PREFECT_API_URL.value()}; deploy the stages with `prefect deploy --all` (prefect.yaml)") from None
    if deployment.work_pool_name != pool:
        where = f"work pool {deployment.work_pool_name!r}" if deployment.work_pool_name else "no work pool (served)"
        raise PlacementError(f"resources.work_pools.{stage}={pool!r}, but deployment {name} is on {where}: "
                             "deploy it to that pool (prefect.yaml) or change the key")


def run_on_pool(stage: str, pool: str, config: PipelineConfig, *, force: bool, sft_model: str | None,
                reward_model: str | None, timeout_s: float) -> Dispatched:
    """Run `stage` (and, from the cache, what it needs) as a flow run of `rlhf/<stage>` on `pool`; wait for a
    worker to pick it up (at most `timeout_s`, then the flow run is cancelled and the pool named) and for it to
    finish (no limit: training takes what it takes). Raises `PlacementError` unless it completed."""
    from prefect.deployments import run_deployment

    check_deployment(stage, pool)
    if tracking_uri().startswith("sqlite:"):
        get_run_logger().warning("%s: the MLflow store is a local file (%s): only workers on this machine can reach "
                                 "it; other machines need a tracking server (MLFLOW_TRACKING_URI)", stage, tracking_uri())
    params = {"pipeline": stage, "config": config.model_dump(mode="json"), "preset": None,
              "force": [stage] if force else [], "sft_model": sft_model, "reward_model": reward_model,
              "local_only": True}
    run = run_deployment(f"rlhf/{stage}", parameters=params, timeout=0,
                         job_variables={"env": {"MLFLOW_TRACKING_URI": tracking_uri()}})
    get_run_logger().info("%s: sent to work pool %r as flow run %s (%s)", stage, pool, run.name, run.id)
    wait_picked_up(run.id, run.name, stage, pool, timeout_s)
    state = wait_final(run.id)
    if state.type.value != "COMPLETED":
        raise PlacementError(f"stage {stage} on work pool {pool!r}: flow run {run.name} ({run.id}) ended "
                             f"{state.type.value}: {state.message or 'no message'}")
    result, metrics = read_back(stage, str(run.id))
    return Dispatched(result, metrics, str(run.id), pool)


def wait_picked_up(run_id: UUID, run_name: str, stage: str, pool: str, timeout_s: float) -> None:
    """Wait until a worker takes the flow run (it leaves the SCHEDULED state); after `timeout_s` cancel it and fail
    naming the pool and whether it has a worker online."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if client.read_flow_run(run_id).state.type.value != "SCHEDULED":
                return
            time.sleep(POLL_S)
        client.set_flow_run_state(run_id, Cancelled(message=f"no worker of pool {pool!r} took it"), force=True)
        online = [w.name for w in client.read_workers_for_work_pool(pool) if w.status.value == "ONLINE"]
    why = (f"its online workers ({', '.join(online)}) were busy" if online else
           f"the pool has no online worker; start one with `prefect worker start --pool {pool}`")
    raise PlacementError(f"stage {stage}: no worker of work pool {pool!r} picked up flow run {run_name} ({run_id}) "
                         f"within {timeout_s:g} s (resources.pool_timeout_s): {why}. The flow run was cancelled.")


def wait_final(run_id: UUID):
    """The flow run's final state, polled."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(run_id).state
            if state.type.value in FINAL:
                return state
            time.sleep(POLL_S)


def read_back(stage: str, flow_run_id: str) -> tuple[StageResult, dict | None]:
    """The stage's result as the flow run on the pool logged it (`read_summary`), with the artifact's identity from
    the stage's own MLflow run."""
    summary = read_summary(flow_run_id)
    entry = summary["stages"][stage]
    tags = RetryingClient().get_run(entry["mlflow_run_id"]).data.tags
    result = StageResult(stage=stage, status=entry["status"], cache_key=entry["cache_key"],
                         mlflow_run_id=entry["mlflow_run_id"], artifact_uri=tags["rlhf.artifact_uri"],
                         digest=tags["rlhf.digest"], model_uri=entry.get("model_uri"), seconds=entry["seconds"])
    return result, summary.get("eval") if stage == "eval" else None


def read_summary(flow_run_id: str) -> dict:
    """The `--json` summary of a completed `rlhf` flow run: `summary.json` of its MLflow parent run (tag
    `rlhf.prefect_flow_run_id`)."""
    import mlflow

    client = RetryingClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'")
    if not runs:
        raise PlacementError(f"flow run {flow_run_id} completed but left no MLflow run in {tracking_uri()}: did its "
                             "worker use another tracking store?")
    return store_call("read summary.json", mlflow.artifacts.load_dict, f"runs:/{runs[0].info.run_id}/summary.json")
