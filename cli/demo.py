"""`make demo` (`rlhf demo`): the services up, the `rlhf/full` deployment run through them, and at the end the run's
figures, where its report is, and its MLflow and Prefect pages (instead of Prefect's dump of the parameters)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rlhf_lib.intervals import split_intervals, with_interval

# The demo's short table: the figures a reader checks first, in this order (where the run has them).
FIGURES = (
    ("reward_model_accuracy", "reward model: held-out pair accuracy"),
    ("win_rate_vs_sft", "PPO vs SFT: gold judge's win rate"),
    ("rm_win_rate_vs_sft", "PPO vs SFT: reward model's win rate"),
    ("gold_reward_mean", "PPO: gold reward"),
    ("gold_reward_mean_sft", "SFT: gold reward"),
    ("gold_reward_mean_new_topics", "PPO: gold on topics never trained on"),
    ("gold_reward_mean_sft_new_topics", "SFT: gold on topics never trained on"),
    ("best_of_4_gold_mean", "best-of-4 from SFT: gold reward"),
    ("gold_lead_over_best_of_4", "PPO's gold lead over best-of-4"),
    ("best_of_16_gold_mean", "best-of-16 from SFT: gold reward"),
    ("gold_lead_over_best_of_16", "PPO's gold lead over best-of-16"),
    ("constant_reply_gold_mean", "best constant reply: gold reward"),
    ("gold_lead_over_constant_reply", "PPO's gold lead over the constant reply"),
    ("kl_to_ref", "PPO: KL to the reference (nats)"),
    ("response_length_mean", "PPO: response length (tokens)"),
)


def figure_lines(summary: dict[str, Any]) -> list[str]:
    """The short table of a pipeline summary's held-out figures, each with its 95 % interval where it has one."""
    values, bounds = split_intervals(summary.get("eval") or {})
    rows = [(label, with_interval(values[key], bounds.get(key))) for key, label in FIGURES
            if values.get(key) is not None]
    if not rows:
        return []
    width = max(len(label) for label, _ in rows)
    return ["held-out figures (95 % intervals):"] + [f"  {label:<{width}}  {text}" for label, text in rows]


def report_lines(summary: dict[str, Any], mlflow_ui: str, prefect_ui: str, artifact_uri: str | None) -> list[str]:
    """Where to look: the eval report (a local path when the artifacts are local files, and its page in the MLflow
    UI), the pipeline's MLflow run and its Prefect flow run."""
    exp, lines = summary.get("mlflow_experiment_id", ""), []
    if eval_run := (summary.get("stages", {}).get("eval") or {}).get("mlflow_run_id"):
        if artifact_uri and artifact_uri.startswith(("file://", "/")):
            lines.append(f"report:  {artifact_uri.removeprefix('file://')}/report/report.html")
        lines.append(f"report:  {mlflow_ui}/#/experiments/{exp}/runs/{eval_run}/artifacts/report/report.html")
    lines.append(f"MLflow:  {mlflow_ui}/#/experiments/{exp}/runs/{summary['mlflow_run_id']}")
    if summary.get("prefect_flow_run_id"):
        lines.append(f"Prefect: {prefect_ui}/runs/flow-run/{summary['prefect_flow_run_id']}")
    return lines


def run_demo(urls: dict[str, str], write: Callable[[str], None] = print) -> int:
    """Run `rlhf/full` on the services at `urls` (`services.servers.up`), wait for it, and print its figures.
    Exit status 0 when the flow run completed."""
    os.environ["PREFECT_API_URL"] = urls["prefect_api"]
    os.environ["MLFLOW_TRACKING_URI"] = urls["mlflow_ui"]
    from prefect.deployments import run_deployment

    from flows.placement import read_summary, wait_final
    from stages.tracking import RetryingClient

    run = run_deployment("rlhf/full", timeout=0)
    write(f"flow run {run.name} of rlhf/full started; its stages, live: {urls['prefect_ui']}/runs/flow-run/{run.id}")
    state = wait_final(run.id)
    if state.type.value != "COMPLETED":
        write(f"flow run {run.name} ended {state.type.value}: {state.message or 'no message'}")
        write(f"Prefect: {urls['prefect_ui']}/runs/flow-run/{run.id}  (its logs say why)")
        return 1
    summary = read_summary(str(run.id))
    eval_run = (summary.get("stages", {}).get("eval") or {}).get("mlflow_run_id")
    artifact_uri = RetryingClient().get_run(eval_run).info.artifact_uri if eval_run else None
    stages = ", ".join(f"{k} {v['status']}" for k, v in summary["stages"].items())
    write(f"rlhf/full {summary['status']} in {summary['seconds']:.0f} s ({stages})")
    for line in figure_lines(summary) + report_lines(summary, urls["mlflow_ui"], urls["prefect_ui"], artifact_uri):
        write(line)
    write("Stop the services with `make down`.")
    return 0
