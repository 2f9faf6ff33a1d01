"""`rlhf run ... --seeds 0,1,2`: the same pipeline once per seed, and each held-out figure's mean and spread over the
seeds. One seed's figures carry the sampling noise of its prompts (their 95 % intervals) but not the noise of
training itself; the spread over seeds shows that, so a change is judged against both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlhf_lib.config import ConfigError, PipelineConfig
from rlhf_lib.intervals import split_intervals, spread

# Every seed of the pipeline but the held-out sampling's (eval.seed): with seed S the data, the models'
# initialisation, SFT's, the RM's and DPO's data order and PPO's sampling all change; seed 0 is the default config.
SEED_KEYS = ("data", "model", "sft", "reward", "ppo", "dpo")
# The figures the spread is reported for (those a summary has: gold figures only where there is a judge).
FIGURES = ("win_rate_vs_sft", "rm_win_rate_vs_sft", "gold_reward_mean", "gold_reward_mean_sft", "reward_mean",
           "kl_to_ref", "response_length_mean", "reward_model_accuracy", "dpo_accuracy")


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` -> [0, 1, 2]; a bad list is refused naming it."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: expected distinct integers, e.g. 0,1,2")
    return seeds


def seeded(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    """`cfg` with every training seed set to `seed` and the run named after it."""
    update: dict[str, Any] = {k: getattr(cfg, k).model_copy(update={"seed": seed}) for k in SEED_KEYS}
    return cfg.model_copy(update={**update, "name": f"{cfg.name}-seed{seed}"})


def run_seeds(cfg: PipelineConfig, seeds: Sequence[int], run: Callable[[PipelineConfig], dict]) -> dict[str, Any]:
    """Run `run(config)` per seed; returns {"seeds": {seed: summary}, "spread": {figure: mean/std/min/max},
    "status"}: completed only when every seed's run completed."""
    summaries = {seed: run(seeded(cfg, seed)) for seed in seeds}
    figures: dict[str, list[float]] = {}
    for summary in summaries.values():
        values, _ = split_intervals(summary.get("eval") or {})
        for key in FIGURES:
            if values.get(key) is not None:
                figures.setdefault(key, []).append(float(values[key]))
    done = all(s.get("status") == "completed" for s in summaries.values())
    return {"status": "completed" if done else "failed", "seeds": summaries,
            "spread": {k: spread(v) for k, v in figures.items() if len(v) == len(seeds)}}


def seed_rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """One row per figure: its value and 95 % interval for each seed, then its mean +- standard deviation."""
    from rlhf_lib.intervals import with_interval

    per_seed = {seed: split_intervals(summary.get("eval") or {}) for seed, summary in result["seeds"].items()}
    rows = []
    for key, s in result["spread"].items():
        row = {"figure": key}
        for seed, (values, bounds) in per_seed.items():
            row[f"seed {seed}"] = with_interval(values.get(key), bounds.get(key))
        rows.append(row | {"mean ± sd": f"{s['mean']:.4g} ± {s['std']:.2g}"})
    return rows
