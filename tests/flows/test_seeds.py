"""`rlhf run --seeds`: the per-seed configs, the spread over seeds, the table, and a bad list refused."""

from __future__ import annotations

import pytest

from cli.seeds import parse_seeds, run_seeds, seed_rows, seeded
from rlhf_lib.config import ConfigError, PipelineConfig


def test_parse_seeds_and_refusals():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("0,x", "", "1,1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_seeded_sets_every_training_seed_but_the_eval_sampling_one():
    cfg = seeded(PipelineConfig(), 3)
    assert (cfg.data.seed, cfg.model.seed, cfg.sft.seed, cfg.reward.seed, cfg.ppo.seed) == (3, 3, 3, 3, 3)
    assert cfg.eval.seed == PipelineConfig().eval.seed and cfg.name == "demo-seed3"
    assert seeded(PipelineConfig(), 0).model_dump(exclude={"name"}) == PipelineConfig().model_dump(exclude={"name"})


def test_run_seeds_reports_mean_and_spread():
    win = {0: 0.8, 1: 0.9, 2: 1.0}

    def run(cfg: PipelineConfig) -> dict:
        w = win[cfg.data.seed]
        return {"status": "completed", "eval": {"win_rate_vs_sft": w, "win_rate_vs_sft_ci95": [w - 0.1, w + 0.05],
                                                "kl_to_ref": 2.0, "gold_reward_mean": None}}

    result = run_seeds(PipelineConfig(), [0, 1, 2], run)
    assert result["status"] == "completed" and list(result["seeds"]) == [0, 1, 2]
    assert result["spread"]["win_rate_vs_sft"] == pytest.approx({"mean": 0.9, "std": 0.1, "min": 0.8, "max": 1.0})
    assert "gold_reward_mean" not in result["spread"]  # no judge: no gold figure
    rows = {r["figure"]: r for r in seed_rows(result)}
    assert rows["win_rate_vs_sft"]["seed 1"] == "0.9 [0.8, 0.95]"
    assert rows["win_rate_vs_sft"]["mean ± sd"] == "0.9 ± 0.1"


def test_one_failed_seed_fails_the_whole():
    result = run_seeds(PipelineConfig(), [0, 1], lambda cfg: {"status": "failed" if cfg.data.seed else "completed"})
    assert result["status"] == "failed"


def test_the_seeds_table_of_a_pipeline_that_ends_at_the_reward_model(capsys, monkeypatch):
    # `rlhf run reward --seeds ...`: each summary's figures are the RM's held-out accuracy (flows.pipeline's
    # reward_figures); `rlhf run sft --seeds ...` has none, and prints its stages without a figures table.
    from cli import console
    from flows.pipeline import reward_figures

    monkeypatch.setattr(console, "where_to_look", lambda summary: [])
    assert reward_figures({"reward/loss": 0.3}) == {}
    acc = {0: 0.94, 1: 0.92}

    def run(cfg: PipelineConfig) -> dict:
        a = acc[cfg.data.seed]
        figures = reward_figures({"reward/heldout_accuracy": a, "reward/heldout_accuracy_ci95_low": a - 0.01,
                                  "reward/heldout_accuracy_ci95_high": a + 0.01})
        return {"pipeline": "reward", "status": "completed", "seconds": 1.0, "stages": {}, "eval": figures}

    out = console.Console(quiet=True)
    out.seeds(run_seeds(PipelineConfig(), [0, 1], run))
    printed = capsys.readouterr().out
    assert "reward_model_accuracy" in printed and "0.94 [0.93, 0.95]" in printed and "0.93 ± 0.014" in printed
    no_figures = {"pipeline": "sft", "status": "completed", "seconds": 1.0, "stages": {}, "eval": {}}
    out.seeds(run_seeds(PipelineConfig(), [0, 1], lambda cfg: no_figures))
    assert "seeds" not in capsys.readouterr().out
