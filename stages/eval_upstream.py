"""What the eval stage reads from its upstream runs in MLflow: the PPO run's curves, tags and alarms, and the RM's
held-out accuracy as its own stage measured it."""

from __future__ import annotations

from rlhf_lib.config import PipelineConfig
from stages.cache import StageResult
from stages.report import CURVES
from stages.tracking import RetryingClient


def ppo_history(ppo_run_id: str, cfg: PipelineConfig) -> dict[str, list[tuple[int, float]]]:
    """The PPO run's curves for the report: the dashboard's, and each reward source's raw score when there are
    several sources."""
    client = RetryingClient()
    sources = [f"objective/score/{r.name}" for r in cfg.ppo.rewards] if len(cfg.ppo.rewards) > 1 else []
    keys = [key for key, _ in CURVES] + sources
    return {key: [(m.step, m.value) for m in client.get_metric_history(ppo_run_id, key)] for key in keys}


def ppo_tags(ppo_run_id: str) -> dict[str, str]:
    return RetryingClient().get_run(ppo_run_id).data.tags if ppo_run_id else {}


def ppo_alarms(tags: dict[str, str]) -> list[str]:
    """The alarms the PPO run raised (its `rlhf.alarm.<name>` tags), as report lines."""
    return [f"{k.removeprefix('rlhf.alarm.')}: {v}" for k, v in sorted(tags.items()) if k.startswith("rlhf.alarm.")]


def measured_accuracy(reward: StageResult) -> float | None:
    """The RM's accuracy on the held-out pairs as the reward stage measured it (`reward/heldout_accuracy` of its
    run), when the RM came from this pipeline's reward stage and so was scored on these pairs; None for a model the
    user named (`--reward-model`: trained on any data) or a run without the figure, which the eval then measures."""
    if reward.source is not None or not reward.mlflow_run_id:
        return None
    return RetryingClient().get_run(reward.mlflow_run_id).data.metrics.get("reward/heldout_accuracy")


def training_seconds(upstream: dict[str, StageResult]) -> dict[str, float]:
    """Wall seconds of each upstream stage's own MLflow run (its end less its start: the run that trained the model,
    also when this pipeline found it cached), by the name of the arm it trained: `sft`, `reward`, `ppo`, `dpo` and
    each control (`zero_reward`, from upstream `ppo-zero_reward`). A run without an end (still open, or a model the
    user named by URI) is left out."""
    client, out = RetryingClient(), {}
    for name, result in upstream.items():
        if result.source is not None or not result.mlflow_run_id:
            continue
        info = client.get_run(result.mlflow_run_id).info
        if info.start_time and info.end_time:
            out[name.removeprefix("ppo-")] = (info.end_time - info.start_time) / 1000.0
    return out
