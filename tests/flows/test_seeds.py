"""`rlhf run --seeds`: the per-seed configs, the spread over seeds, the table, and a bad list refused."""

from __future__ import annotations

import pytest

from flows.seeds import parse_seeds, run_seeds, seed_rows, seeded
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
