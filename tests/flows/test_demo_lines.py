"""The demo's closing lines from a pipeline summary (`cli.demo`): hand-made summaries, no services."""

from __future__ import annotations

from cli.demo import figure_lines, report_lines

SUMMARY = {
    "mlflow_experiment_id": "1", "mlflow_run_id": "parent", "prefect_flow_run_id": "fr-1",
    "stages": {"eval": {"mlflow_run_id": "evalrun", "status": "ran"}},
    "eval": {"win_rate_vs_sft": 0.8635, "win_rate_vs_sft_ci95": [0.84, 0.885], "kl_to_ref": 3.186,
             "reward_model_accuracy": 0.9309, "reward_model_accuracy_ci95": [0.92, 0.94], "gold_topic_mean": 0.59},
}


def test_figure_lines_keep_the_short_list_in_its_order_with_intervals():
    assert figure_lines(SUMMARY) == [
        "held-out figures (95 % intervals):",
        "  reward model: held-out pair accuracy  0.9309 [0.92, 0.94]",
        "  PPO vs SFT: gold judge's win rate     0.8635 [0.84, 0.885]",
        "  PPO: KL to the reference (nats)       3.186",
    ]
    assert figure_lines({"eval": {}}) == []


def test_report_lines_give_the_local_path_only_for_local_artifacts():
    local = report_lines(SUMMARY, "http://m", "http://p", "file:///s/artifacts/1/evalrun/artifacts")
    assert local == ["report:  /s/artifacts/1/evalrun/artifacts/report/report.html",
                     "report:  http://m/#/experiments/1/runs/evalrun/artifacts/report/report.html",
                     "MLflow:  http://m/#/experiments/1/runs/parent", "Prefect: http://p/runs/flow-run/fr-1"]
    remote = report_lines(SUMMARY, "http://m", "http://p", "mlflow-artifacts:/1/evalrun/artifacts")
    assert remote == local[1:]
