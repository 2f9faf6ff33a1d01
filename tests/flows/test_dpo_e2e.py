"""The DPO branch end to end: `rlhf run dpo` (data -> sft -> dpo) on the micro preset with a few DPO steps, against a
real temporary MLflow store and the session's Prefect server: the stage runs, logs TRL's metrics and the held-out
accuracy of its implicit reward, registers `rlhf-dpo`, and an unchanged rerun is all cached; `full` with
`dpo.enabled` takes it from the cache and its eval samples the DPO policy beside PPO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import mlflow
from mlflow import MlflowClient

from cli.main import load_config

SETS = ["dpo.enabled=true", "dpo.batch_size=16", "dpo.max_steps=3"]
TRL_METRICS = {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected"}


def statuses(summary):
    return {k: v["status"] for k, v in summary["stages"].items()}


def dpo_runs(experiment_id: str) -> list:
    return MlflowClient().search_runs([experiment_id], "tags.`rlhf.stage` = 'dpo'")


@pytest.fixture(scope="module")
def first(home):
    from flows.pipeline import rlhf

    return rlhf(config=load_config("micro", None, SETS), pipeline="dpo")


def test_the_dpo_pipeline_runs_data_sft_dpo_and_registers_rlhf_dpo(first):
    assert first["status"] == "completed" and first["pipeline"] == "dpo"
    assert statuses(first) == {"data": "ran", "sft": "ran", "dpo": "ran"}
    uri = first["stages"]["dpo"]["model_uri"]
    assert uri.startswith("models:/rlhf-dpo/")
    name, version = uri.removeprefix("models:/").split("/")
    mv = MlflowClient().get_model_version(name, version)
    assert mv.tags["rlhf.upstream.sft"] == first["stages"]["sft"]["model_uri"]
    run = MlflowClient().get_run(first["stages"]["dpo"]["mlflow_run_id"])
    assert run.data.tags["rlhf.stage"] == "dpo" and run.data.tags["mlflow.parentRunId"] == first["mlflow_run_id"]
    assert 0.0 <= first["eval"]["dpo_accuracy"] <= 1.0  # the pipeline's figure, with its interval
    assert first["eval"]["dpo_accuracy"] == run.data.metrics["dpo/heldout_accuracy"]


def test_the_run_logs_trls_metrics_every_step_and_the_heldout_accuracy(first):
    from rlhf_lib.metric_docs import documented

    client = MlflowClient()
    run_id = first["stages"]["dpo"]["mlflow_run_id"]
    metrics = client.get_run(run_id).data.metrics
    assert TRL_METRICS <= set(metrics)
    assert {"dpo/heldout_accuracy", "dpo/heldout_accuracy_ci95_low", "dpo/heldout_accuracy_ci95_high"} <= set(metrics)
    assert metrics["dpo/heldout_accuracy_ci95_low"] <= metrics["dpo/heldout_accuracy"] <= \
        metrics["dpo/heldout_accuracy_ci95_high"]
    assert len(client.get_metric_history(run_id, "rewards/margins")) == 3 == metrics["dpo/steps"]
    assert sorted(k for k in metrics if not documented(k)) == []


def test_the_policy_loads_back_through_its_registry_uri(first):
    from stages.models_io import load_policy

    model, tokenizer = load_policy(first["stages"]["dpo"]["model_uri"])
    assert model.config.n_embd == 32 and tokenizer.pad_token_id != tokenizer.eos_token_id


def test_an_unchanged_rerun_is_cached_and_trains_nothing(first):
    from flows.pipeline import rlhf

    again = rlhf(config=load_config("micro", None, SETS), pipeline="dpo")
    assert statuses(again) == {"data": "cached", "sft": "cached", "dpo": "cached"}
    assert again["stages"]["dpo"]["mlflow_run_id"] == first["stages"]["dpo"]["mlflow_run_id"]
    assert again["eval"] == first["eval"]
    assert len(dpo_runs(first["mlflow_experiment_id"])) == 1  # no second DPO run was opened
    # `enabled` chooses whether it runs, not what it trains: not in the key
    off = rlhf(config=load_config("micro", None, [*SETS[1:], "dpo.enabled=false"]), pipeline="dpo")
    assert off["stages"]["dpo"]["status"] == "cached"


def test_force_dpo_retrains_only_the_branch(first):
    from flows.pipeline import rlhf

    out = rlhf(config=load_config("micro", None, SETS), pipeline="dpo", force=["dpo"])
    assert statuses(out) == {"data": "cached", "sft": "cached", "dpo": "ran"}


def test_the_full_pipeline_runs_the_branch_when_enabled_from_the_same_cache(first):
    from flows.pipeline import rlhf

    out = rlhf(config=load_config("micro", None, SETS), pipeline="full")
    assert statuses(out) == {"data": "cached", "sft": "cached", "reward": "ran", "ppo": "ran", "eval": "ran",
                             "dpo": "cached"}  # the dpo pipeline's run: one key whichever pipeline runs it
    run = MlflowClient().get_run(out["stages"]["dpo"]["mlflow_run_id"])  # the newest of the key (force's above)
    assert run.data.tags["rlhf.stage"] == "dpo" and run.info.run_id in {r.info.run_id for r in
                                                                        dpo_runs(first["mlflow_experiment_id"])}
    # its figure beside the reward model's, on the same held-out pairs
    assert out["eval"]["dpo_accuracy"] == run.data.metrics["dpo/heldout_accuracy"]
    assert "reward_model_accuracy" in out["eval"]
    # the eval sampled the DPO policy beside PPO as one more arm: its figures and PPO's paired leads over it, each
    # with its interval, in the pipeline's figures, the eval run's metrics and the report's controls table
    for key in ("dpo_reward_mean", "dpo_gold_reward_mean", "dpo_kl_to_ref", "dpo_response_length_mean",
                "dpo_win_rate_vs_sft", "reward_lead_over_dpo", "gold_lead_over_dpo", "win_rate_vs_dpo",
                "rm_win_rate_vs_dpo"):
        assert out["eval"][key] is not None and len(out["eval"][f"{key}_ci95"]) == 2, key
    assert 0.0 <= out["eval"]["dpo_no_eos_frac"] <= 1.0
    eval_run = out["stages"]["eval"]["mlflow_run_id"]
    logged = MlflowClient().get_run(eval_run).data.metrics
    assert logged["eval/reward_lead_over_dpo"] == pytest.approx(out["eval"]["reward_lead_over_dpo"])
    assert logged["eval/reward_lead_over_dpo"] == pytest.approx(logged["eval/reward_mean"] -
                                                                logged["eval/dpo_reward_mean"], abs=1e-5)
    # DPO meets best-of-4 on the same prompts as PPO does; every policy in one table, with its stage's minutes
    assert out["eval"]["dpo_win_rate_vs_best_of_4"] is not None and len(out["eval"]["dpo_win_rate_vs_best_of_4_ci95"]) == 2
    report = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=eval_run, artifact_path="report/report.json"
                                                                 )).read_text())
    assert {"sft", "reward", "ppo", "dpo"} <= set(report["training_seconds"])
    assert all(v > 0 for v in report["training_seconds"].values())
    html = Path(mlflow.artifacts.download_artifacts(run_id=eval_run, artifact_path="report/report.html")).read_text()
    assert "the DPO policy (the same pairs, no reward model, no sampling)" in html and "<td>DPO policy</td>" in html
    assert "Every policy on the same prompts, under the judge" in html and "Paired win rates under the judge" in html
    samples = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=eval_run,
                                                                  artifact_path="report/samples.json")).read_text())
    assert all(isinstance(row["dpo_response"], str) for row in samples)


def test_the_branch_follows_what_it_reads():
    from flows.pipeline import downstream_of

    assert downstream_of(["dpo"]) == ["dpo"]
    assert downstream_of(["sft"]) == ["sft", "reward", "ppo", "eval", "dpo"]
    assert downstream_of(["reward"]) == ["reward", "ppo", "eval"]
    with pytest.raises(ValueError, match="unknown stage"):
        downstream_of(["dpos"])
