"""End to end: the arithmetic task with the calculator (multi-turn episodes) through the real flow on micro sizes:
the reward stage is skipped, PPO and eval run episodes and show them turn by turn, and an edited environment reruns
PPO and eval only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cli.main import load_config

MICRO = ["data.n_train_prompts=48", "data.n_eval_prompts=8", "model.vocab_size=320", "model.n_layer=1",
         "model.n_head=2", "model.n_embd=32", "model.n_positions=96", "sft.epochs=1", "sft.batch_size=16",
         "ppo.iterations=2", "ppo.batch_size=8", "ppo.minibatches=2", "ppo.sample_every=1", "eval.best_of=[2]",
         "eval.samples_in_report=4"]
ENV_MODULE = '''from rlhf_lib.envs.calculator import CalculatorEnv


class Calc(CalculatorEnv):
    """The calculator, from a module of the user's."""
'''


def _summary(*overrides):
    from flows.pipeline import rlhf

    return rlhf(config=load_config("arithmetic-tool", None, [*MICRO, *overrides]), pipeline="full")


def statuses(summary):
    return {k: v["status"] for k, v in summary["stages"].items()}


@pytest.fixture(scope="module")
def tool_run(home):
    return _summary()


def test_episodes_run_through_ppo_and_eval_and_show_turn_by_turn(tool_run):
    from stages.artifact_cache import download

    assert statuses(tool_run) == {"data": "ran", "sft": "ran", "reward": "skipped", "ppo": "ran", "eval": "ran"}
    assert 0.0 <= tool_run["eval"]["reward_mean"] <= 1.0  # the environment's exact match
    client = MlflowClient()
    ppo_run = client.get_run(tool_run["stages"]["ppo"]["mlflow_run_id"])
    assert {"env/turns_mean", "env/tokens_mean", "env/return_mean", "objective/score_raw"} <= set(ppo_run.data.metrics)
    assert 1.0 <= ppo_run.data.metrics["env/turns_mean"] <= 2.0
    rows = json.loads(Path(download(f"runs:/{ppo_run.info.run_id}/samples/iter_0001.json")).read_text())
    rows = [dict(zip(rows["columns"], r)) for r in rows["data"]] if "columns" in rows else rows
    assert all(r["turns"].startswith("policy: ") for r in rows)
    eval_id = tool_run["stages"]["eval"]["mlflow_run_id"]
    sample = json.loads(Path(client.download_artifacts(eval_id, "report/samples.json")).read_text())[0]
    assert sample["ppo_turns"].startswith("policy: ") and sample["sft_turns"].startswith("policy: ")


def test_an_edited_environment_reruns_ppo_and_eval_only(tool_run, tmp_path, monkeypatch):
    (tmp_path / "my_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = _summary("ppo.environment=my_env:Calc")
    assert statuses(mine) == {"data": "cached", "sft": "cached", "reward": "skipped", "ppo": "ran", "eval": "ran"}
    assert statuses(_summary("ppo.environment=my_env:Calc"))["ppo"] == "cached"
    (tmp_path / "my_env.py").write_text(ENV_MODULE + "\n# edited\n")
    assert statuses(_summary("ppo.environment=my_env:Calc")) == {"data": "cached", "sft": "cached",
                                                                 "reward": "skipped", "ppo": "ran", "eval": "ran"}
