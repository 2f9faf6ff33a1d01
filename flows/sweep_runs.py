"""The parts of `rlhf sweep` around its flow (`flows.sweep`): submitting the points to a deployment and waiting for
them, ranking them, and recording the ranking in MLflow and Prefect."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.runtime import flow_run

from flows.placement import FINAL, POLL_S, PlacementError, read_summary
from rlhf_lib.config import PipelineConfig
from stages.owner import owner_tags
from stages.tracking import MODEL_NAMES, RetryingClient, tracking_uri

# The columns of the ranking besides the point's keys and the ranked figure.
COLUMNS = ("kl_to_ref", "reward_mean", "response_length_mean")


def submit_all(deployment: str, configs: Sequence[PipelineConfig], pinned: dict[str, str],
               timeout_s: float) -> list[dict[str, Any]]:
    """Submit one flow run of `deployment` (pipeline `eval`) per config at once, the SFT and reward models pinned;
    wait for all of them. No run taken by a worker within `timeout_s`: all are cancelled and the pool is named.
    Returns each point's summary, or {"status": "failed", "message"} for a run that did not complete."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_deployment_by_name(deployment).work_pool_name
        except ObjectNotFound:
            raise PlacementError(f"no deployment {deployment} on the Prefect API: deploy it (`prefect deploy --all`, "
                                 "or `rlhf up`), or run the points here with --here") from None
    runs = [run_deployment(deployment, timeout=0, flow_run_name=f"sweep-{cfg.name}",
                           parameters={"pipeline": "eval", "config": cfg.model_dump(mode="json"), "preset": None,
                                       "sft_model": pinned.get("sft"), "reward_model": pinned.get("reward")},
                           job_variables={"env": {"MLFLOW_TRACKING_URI": tracking_uri()}}) for cfg in configs]
    get_run_logger().info("sweep: submitted %s to %s (%s)", ", ".join(r.name for r in runs), deployment,
                          f"work pool {pool!r}" if pool else "served")
    states = _wait(runs, deployment, pool, timeout_s, Cancelled)
    return [read_summary(str(r.id)) if states[r.id].type.value == "COMPLETED" else
            {"status": "failed", "prefect_flow_run_id": str(r.id),
             "message": f"flow run {r.name} ended {states[r.id].type.value}: {states[r.id].message or ''}"}
            for r in runs]


def _wait(runs: list, deployment: str, pool: str | None, timeout_s: float, cancelled: Callable) -> dict[UUID, Any]:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            states = {r.id: client.read_flow_run(r.id).state for r in runs}
            if all(s.type.value in FINAL for s in states.values()):
                return states
            if time.monotonic() > deadline and all(s.type.value == "SCHEDULED" for s in states.values()):
                for r in runs:
                    client.set_flow_run_state(r.id, cancelled(message="no worker took it"), force=True)
                where = f"work pool {pool!r}" if pool else f"the process serving {deployment} (`rlhf serve`)"
                raise PlacementError(f"sweep: no point of {deployment} was picked up by {where} within "
                                     f"{timeout_s:g} s (resources.pool_timeout_s); its runs were cancelled. Start a "
                                     + (f"worker: `prefect worker start --pool {pool}`" if pool else "server: `rlhf up`"))
            time.sleep(POLL_S)


def point_summary(run: Callable[[], dict]) -> dict[str, Any]:
    """A point run here: its summary, or its failure as a row of the ranking (the other points still run)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - one failed point must not lose the others' results
        get_run_logger().error("sweep point failed: %s", e)
        return {"status": "failed", "message": f"{type(e).__name__}: {e}"}


def rank(points: Sequence[dict[str, str]], summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point, best first by the held-out figure that chooses the champion (gold win rate against SFT
    where the task has a judge, else the RM reward); failed points last."""
    from stages.eval import champion_metric

    evals = [s.get("eval") or {} for s in summaries]
    metric = champion_metric(next((e for e in evals if e), {}))
    rows = []
    for point, summary, ev in zip(points, summaries, evals, strict=True):
        row: dict[str, Any] = {**point, "status": summary.get("status", "failed"), metric: ev.get(metric),
                               f"{metric}_ci95": ev.get(f"{metric}_ci95")}
        row |= {k: ev.get(k) for k in COLUMNS}
        ppo = summary.get("stages", {}).get("ppo", {})
        row |= {"policy": ppo.get("model_uri"), "mlflow_run_id": summary.get("mlflow_run_id"),
                "message": summary.get("message", "")}
        rows.append(row)
    rows.sort(key=lambda r: (r[metric] is None, -(r[metric] or 0.0)))
    return [{"rank": i + 1, "metric": metric, **r} for i, r in enumerate(rows)]


def record(experiment_id: str, config: PipelineConfig, rows: list[dict[str, Any]], pinned: dict[str, str],
           champion_before: str | None) -> str:
    """The sweep's MLflow run (ranking table, best figure, upstream models, the champion after it) and its Prefect
    table artifact; returns the run's id."""
    from prefect.artifacts import create_table_artifact

    client = RetryingClient()
    run = client.create_run(experiment_id, run_name=f"sweep-{config.name}", tags={
        "rlhf.sweep": "true", "rlhf.prefect_flow_run_id": str(flow_run.id or ""), **owner_tags(),
        **{f"rlhf.upstream.{k}": v for k, v in pinned.items()}})
    run_id = run.info.run_id
    best = rows[0]
    if best[best["metric"]] is not None:
        client.log_metric(run_id, f"best_{best['metric']}", best[best["metric"]])
        client.set_tag(run_id, "rlhf.sweep.best", best["policy"] or "")
    champion = settle_champion(rows, best["metric"], champion_before)
    client.set_tag(run_id, "rlhf.champion", champion or "")
    for row in rows:
        row["champion"] = bool(champion) and row["policy"] == champion
    client.log_dict(run_id, rows, "ranking.json")
    client.set_terminated(run_id, "FINISHED" if all(r["status"] == "completed" for r in rows) else "FAILED")
    create_table_artifact([{k: v for k, v in r.items() if k not in ("mlflow_run_id", "metric")} for r in rows],
                          key="rlhf-sweep", description=f"PPO sweep ranked by {best['metric']}; MLflow run {run_id}")
    return run_id


def champion_version() -> str | None:
    """The version of `rlhf-policy` that holds the `champion` alias, if one does."""
    from mlflow.exceptions import MlflowException

    try:
        return RetryingClient().get_model_version_by_alias(MODEL_NAMES["ppo"], "champion").version
    except MlflowException:
        return None


def settle_champion(rows: list[dict[str, Any]], metric: str, before: str | None) -> str | None:
    """Give `rlhf-policy@champion` to the best of the points and the champion they had to beat (version `before`,
    read when the sweep started); returns its
    `models:/rlhf-policy/<v>`. Each point's eval already promotes its policy when it wins, but points finishing at
    once on different machines race for the alias (the eval's lock is one machine's file), so the sweep settles it
    from the figures each version carries (`rlhf.eval.<metric>`)."""
    name, client = MODEL_NAMES["ppo"], RetryingClient()
    scored = [(r[metric], r["policy"]) for r in rows if r[metric] is not None and r["policy"]]
    if before is not None:
        tags = client.get_model_version(name, before).tags
        scored.append((float(tags.get(f"rlhf.eval.{metric}", "-inf")), f"models:/{name}/{before}"))
    if not scored:
        return None
    value, uri = max(scored, key=lambda x: x[0])
    version = uri.rsplit("/", 1)[1]
    if champion_version() != version:
        client.set_registered_model_alias(name, "champion", version)
        get_run_logger().info("sweep: %s is the champion (%s = %.4f)", uri, metric, value)
    return uri


def nest(summaries: Sequence[dict[str, Any]], sweep_run: str) -> None:
    """Show each point's pipeline run under the sweep's run in the MLflow UI."""
    client = RetryingClient()
    for summary in summaries:
        if summary.get("mlflow_run_id"):
            client.set_tag(summary["mlflow_run_id"], "mlflow.parentRunId", sweep_run)
